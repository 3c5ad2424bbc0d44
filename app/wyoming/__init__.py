"""The Wyoming protocol (Home Assistant's) beside HTTP, over the same engine (docs/wyoming.md)."""
