"""The spot-interruption function: EC2 notices in, a taint and an on-demand surge out.

Transports (each a thin adapter over the same core): ``sqs`` (a Lambda SQS
batch), ``cloudevents`` (Knative, HTTP binary and structured modes),
``poller`` (a local SQS long-poller), ``app`` (the Flask server) and ``cli``.
``events`` decodes EventBridge events into :class:`spotguard.policy.notices.Notice`;
``dispatch`` hands decoded notices to the ``handler`` and counts the outcomes.
"""
