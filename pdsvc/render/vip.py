"""Plan -> keepalived's configuration for the moving address (routers on several hosts).

keepalived(8), Debian's package (2.2), runs on each router host as NAME-vip.service, VRRP only
(``--vrrp``); every directive is keepalived's own (keepalived.conf(5)):

* ``vrrp_version 3`` (RFC 5798): sub-second adverts. A backup takes the address over once it
  misses three (``advert_int`` x 3 plus a skew under one advert): ~1.6 s at 0.5 s;
* ``state BACKUP`` on every host with ``nopreempt``: the first host in `hosts` (the higher
  ``priority``) takes the address when both start, and a host that comes back does not take it
  back from the one serving (a move costs the requests in flight on the old one);
* ``unicast_src_ip`` / ``unicast_peer`` with ``check_unicast_src``: adverts go to the other
  router hosts only (no multicast, which many networks drop) and one from any other address
  is ignored. VRRPv3 has no authentication of its own: keep VRRP to the router hosts' network
  (`pdsvc plan` lists it among the connections);
* ``virtual_ipaddress``: router.vip.address/32 on router.vip.interface; keepalived sends
  gratuitous ARP when it takes it, so clients and switches learn the new host at once.

The unit binds itself to the front (BindsTo=NAME-front.service): a host whose HAProxy stops
gives the address up (keepalived sends priority 0 on its way out, so the other host takes it
at once). Every value is a name or number the schema bounds (host names, interface names,
IPv4 addresses): nothing here can need quoting.
"""

from __future__ import annotations

from pdsvc.plan.types import VipPlan

#: the first router host's VRRP priority; each next one is PRIORITY_STEP lower
PRIORITY, PRIORITY_STEP = 150, 10


def advert_int(ms: int) -> str:
    """keepalived's advert_int, in seconds (VRRPv3 counts centiseconds): 500 -> 0.5."""
    return f"{ms / 1000:g}"


def vip_config(v: VipPlan, host: str, header: list[str]) -> str:
    """The keepalived.conf of router host ``host`` (installed at v.config_path)."""
    names = [m for m, _ in v.members]
    mine = dict(v.members)[host]
    peers = [a for m, a in v.members if m != host]
    lines = [*(f"# {line}" for line in header), "",
             "global_defs {",
             f"    router_id {v.name}-{host}",
             "    vrrp_version 3",
             "}",
             "",
             f"vrrp_instance {v.name} {{",
             "    state BACKUP",
             "    nopreempt",
             f"    interface {v.interface}",
             f"    virtual_router_id {v.vrrp_id}",
             f"    priority {PRIORITY - PRIORITY_STEP * names.index(host)}",
             f"    advert_int {advert_int(v.advert_ms)}",
             f"    unicast_src_ip {mine}",
             "    unicast_peer {",
             *(f"        {a}" for a in peers),
             "    }",
             "    check_unicast_src",
             "    virtual_ipaddress {",
             f"        {v.address}/32 dev {v.interface}",
             "    }",
             "}",
             ""]
    return "\n".join(lines)
