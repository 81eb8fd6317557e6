"""The control plane: the job's step-boundary collectives (agreement, broadcasts, votes, the
profile's reduction, each stage's plan), flat or along the job's grid, and the thread they run on."""
