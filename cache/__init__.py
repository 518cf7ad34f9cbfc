"""Everything that lives in Redis: key schema, job store, worker registry."""
