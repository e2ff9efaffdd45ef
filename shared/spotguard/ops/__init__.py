"""What an operator runs on a laptop: the demo's full cycle, replay, what-if and snapshots.

- :mod:`serving`: serving replicas per workload on the simulated cluster (the truth);
- :mod:`aws`: moto with the EventBridge rule and SQS queue infra/aws deploys;
- :mod:`functions`: the three functions run as in production, node-added behind a seam;
- :mod:`cycle`: one full interruption cycle (notice, reclaim, return to spot);
- :mod:`report`: the cycle against the promise: rows, JSON, table, plot;
- :mod:`live`: the live progress view;
- :mod:`signals`: SIGTERM unwinds like Ctrl-C, so everything started is stopped;
- :mod:`eventfiles`, :mod:`replay`, :mod:`snapshot`, :mod:`simulate`: the other commands.
"""
