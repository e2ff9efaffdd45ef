"""The node-added function: back to spot, floors repaired, leftovers cleaned (the safety net).

:mod:`reconciler` is the core (one pass over the cluster); :mod:`triggers`
decodes what starts a pass (a Node added, a ping, an EC2 state change, a
schedule); :mod:`cloudevents`, :mod:`awslambda`, :mod:`app` and :mod:`cli` are
the transports.
"""
