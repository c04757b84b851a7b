"""Reports of a run: the report directory (JUnit per device, summary.md, results.json), and the release
qualification report (its view model, rendered as Markdown, as a self-contained HTML page with SVG plots,
and as records of the PyTorch benchmark database v3)."""
