"""The local stack: the service on one machine, with an embedded AWS emulator (moto server)."""
