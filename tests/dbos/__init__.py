"""The DBOS tier: durable sessions on DBOS, on SQLite and on a throwaway Postgres cluster."""
