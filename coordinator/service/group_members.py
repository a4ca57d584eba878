"""Where the coordinator group's workers serve their web views, as the group's description at the
broker says (each worker's Kafka client id names its port:
:func:`coordinator.service.group_view.web_client_id`). The commands that take ``--url`` find a worker
this way when it is not given, and so does ``cutline doctor``."""

from __future__ import annotations

import urllib.error
import urllib.request

from coordinator.service.group_view import views_url

DEFAULT_URL = "http://127.0.0.1:6066"
"""The local worker's views (``cutline coordinator``'s default ``--web-port``)."""


def coordinator_urls(bootstrap: str, topic_prefix: str, timeout: float = 10.0) -> list[str]:
    """The views of the coordinator group's workers of ``topic_prefix``, from the group's description
    (none on the embedded Tansu broker, which describes a group without its members)."""
    from events.dev.broker import _admin

    admin = _admin(bootstrap)
    group = f"{topic_prefix}coordinator"
    description = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result()
    found = (views_url(m.client_id, m.host) for m in description.members)
    return sorted({url for url in found if url is not None})


def answers(url: str, timeout: float = 1.0) -> bool:
    """Does a coordinator worker answer at ``url`` (its ``/ready``, whatever the status)?"""
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # a 503 is a worker answering
    except (urllib.error.URLError, OSError, ValueError):
        return False
