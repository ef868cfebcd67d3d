"""A task module that fails to import (for the start-refuses test)."""

raise RuntimeError("this task module is broken on purpose")
