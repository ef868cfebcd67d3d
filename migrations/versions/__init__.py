"""Numbered floor migrations, each with upgrade and downgrade."""
