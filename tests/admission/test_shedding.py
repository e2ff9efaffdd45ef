"""A review that waited out its deadline before it was served is shed, not answered late.

kube-apiserver gives up on a webhook call after ``timeoutSeconds`` and admits
the pod unpatched; an answer that comes later is lost and whatever it wrote is
a lie. The served webhook counts a review's deadline from when the gunicorn
worker had the request ready (not from when a thread got to it), and never
past two thirds of the caller's own ``?timeout=``: a review that has no time
left when a thread takes it is answered at once, allowed and unchanged,
counted in ``spotguard_admission_shed_total`` and logged.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from pathlib import Path

import pytest
import requests
from spotguard.admission import connections, core, deadline, server

from tests.admission import burst, clients, cluster, harness, servers


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("3s", 3.0), ("2.5s", 2.5), ("1500ms", 1.5), ("1m0s", 60.0), ("1m30s", 90.0), ("250us", 250e-6)],
)
def test_the_callers_timeout_is_read_as_a_go_duration(raw: str, seconds: float) -> None:
    assert deadline.parse_timeout(raw) == pytest.approx(seconds)


@pytest.mark.parametrize("raw", [None, "", "3", "s", "-1s", "3 s", "0s", "3x"])
def test_a_timeout_that_is_not_a_duration_is_ignored(raw: str | None) -> None:
    assert deadline.parse_timeout(raw) is None


def test_the_deadline_bounds_the_work_and_stays_inside_the_callers_timeout_from_arrival() -> None:
    assert deadline.for_review(2.0).remaining() == pytest.approx(2.0, abs=0.05)  # no server stamp: work only
    with deadline.arrived(time.monotonic() - 0.5):
        assert deadline.for_review(2.0).remaining() == pytest.approx(2.0, abs=0.05)  # 0.5 + 2.0 < 0.85 x 3 s
    with deadline.arrived(time.monotonic() - 1.5):
        assert deadline.for_review(2.0).remaining() == pytest.approx(1.05, abs=0.05)  # 0.85 x 3 s - 1.5 s
    with deadline.arrived(time.monotonic(), timeout=1.0):
        assert deadline.for_review(2.0).remaining() == pytest.approx(0.85, abs=0.05)
    with deadline.arrived(time.monotonic() - 40.0, timeout=60.0):
        assert deadline.for_review(20.0).remaining() == pytest.approx(11.0, abs=0.05)


def test_the_tls_context_is_built_once_and_again_when_the_certificate_changes(tmp_path: Path) -> None:
    tls = servers.make_certs(tmp_path / "tls")
    built: list[ssl.SSLContext] = []

    class Conf:
        certfile, keyfile, ca_certs = str(tls.cert), str(tls.key), None

    def factory() -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(Conf.certfile, Conf.keyfile)
        built.append(context)
        return context

    first = server.tls_context(Conf, factory)
    assert server.tls_context(Conf, factory) is first
    assert first.minimum_version == ssl.TLSVersion.TLSv1_2
    servers.make_certs(tmp_path / "tls")  # a rotated Secret: new files under the same names
    assert server.tls_context(Conf, factory) is not first
    assert len(built) == 2


def test_a_review_that_waited_past_its_deadline_is_shed_at_once(tmp_path: Path) -> None:
    # GIVEN a webhook with one thread, held by a connection stopped half-way through its TLS
    # handshake (the client limit, raised to 30 s here, would free the thread only then)
    tls = servers.make_certs(tmp_path / "tls")
    env = {connections.SETTING: "30"}
    with servers.running(tls, tmp_path, workers=1, threads=1, env=env) as s:
        stall = clients.half_hello(clients.address(s.url), s.ca)
        harness.wait_for(lambda: _accepted(s), timeout=30, what="the stalled connection to take the thread")
        # WHEN a review whose caller gives it 1 s arrives behind it, and the thread is freed 1.5 s later
        rs = {
            "metadata": {"name": "web-1", "namespace": "shop", "uid": "u1"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {"containers": []}}},
        }
        review = burst.review_of(burst.pod_of(rs))
        answers: list[requests.Response] = []
        sender = threading.Thread(
            target=lambda: answers.append(
                requests.post(s.url + "/mutate?timeout=1s", json=review, verify=s.ca, timeout=60)
            )
        )
        sender.start()
        time.sleep(1.5)  # the review waits behind the stalled handshake
        stall.close()
        sender.join(60)
        # THEN it is answered at once, allowed and unchanged, as shed
        assert len(answers) == 1 and answers[0].status_code == 200
        response = answers[0].json()["response"]
        assert response["allowed"] is True and "patch" not in response
        assert burst.undecided(response) is not None
        assert response["auditAnnotations"]["spotguard.io/decision"].startswith("shed:")
        assert harness.metric(s, "spotguard_admission_shed_total") == 1
        assert "review shed" in s.log.read_text()


def _accepted(s: servers.Server) -> bool:
    """The server took the stalled connection (a probe on a second connection is not answered)."""
    try:
        requests.get(s.url + "/healthz", verify=s.ca, timeout=0.3)
    except requests.RequestException:
        return True
    return False


def test_a_fresh_review_is_not_shed(tmp_path: Path) -> None:
    tls = servers.make_certs(tmp_path / "tls")
    with servers.running(tls, tmp_path, workers=1, threads=2) as s:
        pod = cluster.pod_for(
            {"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "shop", "uid": "u"}, "spec": {}}
        )
        answer = requests.post(
            s.url + "/mutate?timeout=3s", json=cluster.review(pod, "shop"), verify=s.ca, timeout=30
        ).json()
        assert answer["response"]["allowed"] is True
        assert not json.dumps(answer).count("shed")
        assert harness.metric(s, "spotguard_admission_shed_total") == 0


def test_each_api_call_may_take_a_share_of_the_review_deadline() -> None:
    # outside a review (warm-ups): the policy made for a 2 s review, scaled to the deadline
    assert core.api_policy(core.API_POLICY_REVIEW) == core.API_POLICY  # 1.5 s a call, 1 s an attempt
    slow = core.api_policy(20.0)  # a slow control plane's deadline: calls may take longer too
    assert (slow.deadline, slow.timeout, slow.connect_timeout) == pytest.approx((15.0, 10.0, 5.0))
    assert core.Context(core.Config(), object(), review_seconds=20.0).kube.policy == slow  # type: ignore[union-attr]
