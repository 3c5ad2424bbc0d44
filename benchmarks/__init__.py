"""Playhead benchmarks: the load generator, the simulated player, reports, the simulator."""
