"""Alembic migrations for the EchoMQ floor, shipped inside the wheel.

Run them with ``echomq-supervisor migrate --floor-url URL`` (or
``echomq.floor.Floor.upgrade``); both locate this package with
``importlib.resources`` so they work from an installed package.
"""
