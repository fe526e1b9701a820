"""Which network interface gloo must use on a host of a cluster (pure sockets).

In a network namespace (a test host) or on a node with several interfaces, gloo's
default guess (the address the hostname resolves to) can name an interface that the
peers cannot reach; :func:`interface_towards` names the one the kernel routes the
world's rendezvous host through, for ``GLOO_SOCKET_IFNAME``. Used by the sync agents
and by a training gang's ranks (:mod:`weave_slurm.hosted.world`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

SIOCGIFADDR = 0x8915


def interface_towards(host: str) -> str | None:
    """The name of the interface this host reaches ``host`` through (gloo must use it:
    in a network namespace its default guess is wrong)."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
        except OSError:
            return None
        local = s.getsockname()[0]
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return None


def use_interface_towards(host: str, env: MutableMapping[str, str] = os.environ) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` to the interface towards ``host`` unless the site set
    it; the name in effect (None: gloo guesses)."""
    iface = env.get("GLOO_SOCKET_IFNAME") or interface_towards(host)
    if iface:
        env["GLOO_SOCKET_IFNAME"] = iface
    return iface
