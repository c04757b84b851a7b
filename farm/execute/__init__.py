"""Work on a leased device: deploy a bundle (content-addressed), build the runner's command line for
its dialect, run it and read its outputs back, compare the updaters' outputs."""
