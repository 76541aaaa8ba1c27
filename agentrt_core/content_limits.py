"""Size limits of registry content (documented in docs/digest.md, "Limits").

They keep one publish well inside the server's 8 MiB message limit and keep digesting fast
(a 1 MiB definition digests in a few milliseconds).
"""

from __future__ import annotations

from typing import Final

from agentrt_core import paging

#: Canonical bytes of one component document (spec, description, names).
MAX_COMPONENT_BYTES: Final = 2 * 1024 * 1024
#: Characters of a description (component or agent).
MAX_DESCRIPTION_CHARS: Final = 16 * 1024
#: Files in one skill, and bytes (UTF-8) of one file's content.
MAX_SKILL_FILES: Final = 100
MAX_SKILL_FILE_BYTES: Final = 1024 * 1024
#: References of each list in an agent definition.
MAX_AGENT_SKILLS: Final = 256
MAX_AGENT_TOOLS: Final = 256
#: Characters of a reference, an actor, a request id, a tag-move reason.
MAX_REF_CHARS: Final = 200
MAX_ACTOR_CHARS: Final = 200
MAX_REASON_CHARS: Final = 4096
#: Provenance: characters per field and number of labels.
MAX_PROVENANCE_FIELD_CHARS: Final = 2048
MAX_PROVENANCE_LABELS: Final = 64
#: Page sizes of list calls: those of every service (agentrt_core.paging).
DEFAULT_PAGE_SIZE: Final = paging.DEFAULT_PAGE_SIZE
MAX_PAGE_SIZE: Final = paging.MAX_PAGE_SIZE
