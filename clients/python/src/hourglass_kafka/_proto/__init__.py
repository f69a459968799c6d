"""Generated from proto/hourglass/v1/hourglass.proto by generate.sh."""
