"""The EchoMQ supervisor: metronomes, forked consumers poked over pipes, the floor scheduler."""

from echomq.extras import require

require("supervisor", "the EchoMQ supervisor")
