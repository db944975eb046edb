"""Which addresses a process listens on (Linux, from /proc), for the tests of what the ring's processes expose.

Torch only beside the standard library, so a test's subprocess can import it without the package.
"""

import os
import socket
import struct

import torch.distributed as dist


def listening(pid):
    """The TCP addresses process `pid` listens on, `[(host, port)]`: its sockets (the inodes its descriptors
    name) looked up in the kernel's tables of its network namespace, /proc/PID/net/tcp and tcp6."""
    inodes = set()
    for descriptor in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{descriptor}")
        except OSError:  # closed since listed
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        if not os.path.exists(f"/proc/{pid}/net/{table}"):  # no IPv6
            continue
        with open(f"/proc/{pid}/net/{table}") as rows:
            next(rows)  # the header
            for row in rows:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # state 0A: LISTEN
                    address, port = fields[1].split(":")
                    raw = bytes.fromhex(address)  # 32-bit words, each in the host's (little-endian) order
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                    found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def non_loopback_interface():
    """`(name, IPv4 address)` of a network interface other than loopback, or None."""
    import fcntl

    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:  # SIOCGIFADDR: the interface's IPv4 address
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
            except OSError:  # none
                continue
        address = socket.inet_ntoa(answer[20:24])
        if not address.startswith("127."):
            return name, address
    return None


def report_listeners():
    """Run in a launched process (the launch's group is up): make one more group, as a sweep's `subgroup`
    does, and return what the host name resolves to here and every address this process listens on."""
    dist.new_group(list(range(dist.get_world_size())))
    return {"resolves_to": socket.gethostbyname(socket.gethostname()), "listening": listening(os.getpid())}
