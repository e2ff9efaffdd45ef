"""The admission function: a mutating webhook that places new pods on on-demand or spot.

``core.serve(review, ctx)`` is the transport-free core; ``app`` (Flask),
``server`` (gunicorn, HTTPS), ``functions/admission`` (Knative, Lambda) adapt it.
"""
