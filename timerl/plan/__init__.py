"""The plan: everything decided between the schedule and the run (regions, store kinds,
donations, the iteration loop, the peak-memory estimate), as one frozen value."""
