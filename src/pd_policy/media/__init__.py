"""Media identity: what names a media item, whose fetch rules apply to it, and how a client's
name for an item is scoped to its tenant.

An item's identity is its content and its processing options, never its URL
([`identity`][pd_policy.media.identity]); a URL is read only within the worker's own rules
([`rules`][pd_policy.media.rules]); and a client's ``uuid`` for an item is scoped to its
tenant before any worker trusts it ([`uuid_scope`][pd_policy.media.uuid_scope]). The media
errors are the seed's taxonomy (``pd_policy.media_errors``).

May import: the seed's policy only, never another sub-package.
"""
