"""A FastAPI service that adds jobs from its request handlers: see README.md."""
