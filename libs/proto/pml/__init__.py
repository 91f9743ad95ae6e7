"""Generated protobuf/gRPC code for the pml.v1 contracts."""
