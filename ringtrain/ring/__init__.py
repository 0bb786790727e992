"""The shared-memory ring: control plane, slot protocol and payload transports."""
