"""Reports and plots made from recorded runs: the comparison report, the headline, reward
curves, sample grids and spot timelines."""
