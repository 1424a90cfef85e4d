"""Many rollout servers as one: the replica set, and weight pushes to them (SGLang's weight-update group, or a
shared folder)."""
