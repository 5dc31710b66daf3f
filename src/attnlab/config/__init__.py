"""The training config: composed by Hydra from conf/, read through one typed schema, checked key by key."""
