"""What a label map (a run's ``labels``, an artifact's ``labels``) may hold: one rule.

Labels are for selecting (``AcquireFilter.labels``, the artifact ``kind`` a completion check
looks for) and are printed one per line by the CLI: a key is a word, never empty, never
holding whitespace or a control character; a value holds no control character (a line break
in a label has no use, and it broke ``agentrt watch``'s one line per event). Sizes are
bounded so a label map costs what its documented limits say (docs/lifecycle.md, "Limits").
Keys and values may be any other Unicode (``étape``, ``Language``).
"""

from __future__ import annotations

import json
import unicodedata

from agentrt_core.errors import ViolationCollector

#: Entries one map may hold, and bytes its JSON may take.
MAX_ENTRIES = 64
MAX_BYTES = 256 * 1024
#: Characters one key, and one value, may take.
MAX_KEY_CHARS = 128
MAX_VALUE_CHARS = 1024


def _control(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" for c in text)


def check(field: str, labels: dict[str, str], problems: ViolationCollector) -> None:
    """Add a violation naming ``field`` (``labels``) or the offending entry
    (``labels[key]``) for each way ``labels`` breaks the rule."""
    if len(labels) > MAX_ENTRIES:
        problems.add(field, f"at most {MAX_ENTRIES} entries")
    if len(json.dumps(labels, ensure_ascii=False).encode()) > MAX_BYTES:
        problems.add(field, f"larger than {MAX_BYTES} bytes")
    for key, value in labels.items():
        where = f"{field}[{json.dumps(key, ensure_ascii=False)}]"
        if not key or len(key) > MAX_KEY_CHARS or _control(key) or any(c.isspace() for c in key):
            problems.add(
                where,
                f"a label key is 1 to {MAX_KEY_CHARS} characters without whitespace or"
                " control characters",
            )
        if len(value) > MAX_VALUE_CHARS or _control(value):
            problems.add(
                where,
                f"a label value is at most {MAX_VALUE_CHARS} characters without control"
                " characters (no line breaks)",
            )
