"""The EchoMQ supervisor: metronomes, forked consumers poked over pipes, the floor scheduler."""
