"""What the tests start and drive: servers, workers, loopback vendors."""
