"""How a tag's name is spelt: in lower case, the one rule for tags and tag policies (issue 25).

The tag grammar (OCI's, ``agentrt_core.refs.TAG_RE``) admits capitals, and tags are compared
exactly, so ``PROD`` set beside ``prod`` was a second tag: one a reader cannot tell apart, and
one a tag policy on ``prod`` did not cover. Tag names stay case-sensitive (a tag is found by
its exact name, so one stored with capitals by an older server still resolves), but the only
spelling a tag may be *set* in, and the only spelling a policy's tag pattern may be written
in, is the one :func:`tag_spelling` gives. Both ask this module: SetTag through
``agentrt_core.refs.is_settable_tag``, the principals file through ``agentrt_base.auth`` (a
pattern spelt otherwise does not load). It lives in the base because the base reads the
principals file and may not import the registry.
"""

from __future__ import annotations


def tag_spelling(text: str) -> str:
    """The spelling tags are set in, of a tag name or a pattern over tag names."""
    return text.lower()


def is_tag_spelling(text: str) -> bool:
    """Whether ``text`` is already spelt as :func:`tag_spelling` spells it."""
    return text == tag_spelling(text)
