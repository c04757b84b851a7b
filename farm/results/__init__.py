"""What a run produced: test records and verdicts (the journal included), results.json, the results
store (runs, results and raw samples in the database, named baselines), and the regression gate."""
