"""Optional integrations with agent frameworks, each behind its own install extra
(`pip install 'steptrail[pydantic-ai]'`). Importing this package imports none of them."""
