"""The config layer: the YAML a user writes, validated into `Config` (schema), with every
field's rules (fields, roles, sections, owned flags), the cross-field checks, one-line errors,
and the generated reference. It imports only the leaves (errors, encode, sglang, routers)."""
