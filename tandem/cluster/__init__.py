"""The cluster simulator behind `tandem sim`: a discrete-event replay of a trace against many simulated workers,
with the live routing and planner policies. Not the sim engine (engines/sim), whose runner one worker holds."""
