"""Reports: the HTML trajectory viewer, metric plots and the compare report (with its plots)."""
