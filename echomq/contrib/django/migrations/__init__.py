"""Django migrations of the echomq app: the transactional outbox table (``0001_outbox``)."""
