"""Reference captures written straight from :mod:`wire` messages.

Until the reference implementation exists (issue 3) these captures are *format* references:
every UM frame is built with the project's encoders in the order a persistent exchange takes
(guide, "Operational View": advertise, register the source, SRI, register the receiver, data,
stability and consumption acknowledgements, keepalives, recovery), so that ``ump dissect``, the
Spark decoder and tshark have a realistic, deterministic file to agree on.  The protocol
*behaviour* they show (which RegIDs a store grants, when it acknowledges) is illustrative; the
behavioural reference is the reference implementation's own captures.

``ume-rpp.pcap`` is the same exchange with receiver-paced persistence (guide
"Receiver-paced Persistence Operations", docs/semantics.md §1.13): the source's PREG carries the
RPP flag and its overrides as EXTOPT configuration options (docs/wire-lbmc.md §2.3, built by
:func:`reference_impl.rpp.source_options`), every PREG-RESP confirms RPP, a second, non-blocking
receiver says its mode the same way, and at the end both receivers and the source deregister
("RPP Deregistration": PREG and PREG-RESP with the D flag).

``python -m captures.reference [OUT_DIR]`` rewrites the committed files; a test proves the
committed bytes equal a fresh generation and that tshark decodes them with no disagreement.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

from reference_impl import rpp
from wire import lbmr, lbtru
from wire.lbmc import (
    AckType,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    Srcidx,
    Sri,
    Topicname,
    UmeAck,
    UmeCapability,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeSid,
    UmeStore,
    UmeStoreGroup,
    UmeStoreid,
)
from wire.pcap import PcapWriter, TcpConversation, udp_frame

HOST = "127.0.0.1"
TOPIC = "ume.reference.topic"
STORE_PORT = 14567
RESOLVER_PORT = 15380
SOURCE_RESOLVER_PORT, RECEIVER_RESOLVER_PORT = 14402, 14403
LBTRU_SOURCE_PORT, LBTRU_RECEIVER_PORT, LBTRU_STORE_PORT = 14380, 14360, 14361
SOURCE_REQUEST_PORT, RECEIVER_REQUEST_PORT = 14391, 14392
SESSION_ID = 0x1234
TOPIC_IDX, TRANSPORT_IDX = 1, 1
SOURCE_REGID, RECEIVER_REGID = 1000, 2000
NON_BLOCKING_REGID = 2001
"""The RPP reference's second receiver (non-blocking)."""
RPP_OVERRIDES = SimpleNamespace(ume_flight_size_bytes=4096, ume_repository_size_limit=1_048_576)
"""The RPP source's overrides in the RPP reference (below the store's defaults, §2.2)."""
SESSION = 0x5E55_1011_0000_0001
MESSAGES = 8


class _Recorder:
    """Collects frames with monotonically increasing timestamps (1 ms apart)."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bytes]] = []
        self.now_us = 1_700_000_000 * 1_000_000  # integer microseconds: no float drift

    def add(self, frame: bytes, gap: float = 0.001) -> None:
        self.now_us += round(gap * 1_000_000)
        self.frames.append((self.now_us / 1_000_000, frame))

    def extend(self, frames: list[bytes]) -> None:
        for frame in frames:
            self.add(frame)


def _control(*headers: object) -> bytes:
    return LbmcMessage(type=MessageType.CONTROL, headers=list(headers)).build()  # type: ignore[arg-type]


def _lbtru_data(sqn: int, dport: int, messages: list[LbmcMessage], rx: bool = False) -> bytes:
    packet = lbtru.LbtruData(sqn=sqn, trail_sqn=0, rx=int(rx),
                             options=[lbtru.SidOption(session_id=SESSION_ID)], payload=messages)
    return udp_frame(HOST, LBTRU_SOURCE_PORT, HOST, dport, packet.build())


def basic_exchange() -> list[tuple[float, bytes]]:
    """One source, one store, one receiver on loopback; LBT-RU transport; LBT-TCP control."""
    return _exchange(rpp_mode=False)


def rpp_exchange() -> list[tuple[float, bytes]]:
    """:func:`basic_exchange` with receiver-paced persistence (module docstring)."""
    return _exchange(rpp_mode=True)


def _exchange(*, rpp_mode: bool) -> list[tuple[float, bytes]]:
    w = int(rpp_mode)
    overrides = [o.header() for o in rpp.source_options(RPP_OVERRIDES)] if rpp_mode else []
    rec = _Recorder()
    # Topic resolution through the unicast resolver daemon (lbmrd) port.
    tqr = lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=TOPIC)])
    rec.add(udp_frame(HOST, RECEIVER_RESOLVER_PORT, HOST, RESOLVER_PORT, tqr.build()))
    tir = lbmr.Tir(
        name=TOPIC, ttl=1, index=TOPIC_IDX,
        info=lbmr.LbtruSidInfo(ip=HOST, session_id=SESSION_ID, port=LBTRU_SOURCE_PORT),
        options=[
            lbmr.ToptUme(store=1, latejoin=1, store_tcp_port=STORE_PORT,
                         src_tcp_port=SOURCE_REQUEST_PORT, store_tcp_addr=HOST,
                         src_tcp_addr=HOST, src_reg_id=SOURCE_REGID,
                         transport_idx=TRANSPORT_IDX),
            lbmr.ToptUmeStore(store_tcp_port=STORE_PORT, store_ip_addr=HOST,
                              src_reg_id=SOURCE_REGID),
            lbmr.ToptUmeStoreGroup(grp_sz=1),
            lbmr.ToptExfunc(src_tcp_port=SOURCE_REQUEST_PORT, src_ip_addr=HOST,
                            ume=1, lj=1),
        ])
    advert = lbmr.LbmrPacket(tirs=[tir])
    rec.add(udp_frame(HOST, SOURCE_RESOLVER_PORT, HOST, RESOLVER_PORT, advert.build()))

    # Source registration with the store (RegID requested: 0 = let the store assign one).
    src = TcpConversation((HOST, 50001), (HOST, STORE_PORT), isn=(100, 900))
    rec.extend(src.handshake())
    rec.add(src.send(True, _control(
        UmePreg(s_flag=1, marker=1, reg_id=0, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                resp_port=SOURCE_REQUEST_PORT, resp_ip=HOST, w_flag=w),
        UmeCapability(qc_flag=1), UmeSid(sid=SESSION), *overrides)))
    rec.add(src.send(False, _control(
        UmePregResp(reg_id=SOURCE_REGID, s_flag=1, marker=1, transport_idx=TRANSPORT_IDX,
                    topic_idx=TOPIC_IDX, low_seqnum=0, high_seqnum=0, w_flag=w),
        UmeStoreid(store_id=1))))

    # The receiver joins the LBT-RU session; the source then sends SRI over the transport.
    ru_setup = [
        (LBTRU_RECEIVER_PORT, LBTRU_SOURCE_PORT, lbtru.LbtruCreq(
            options=[lbtru.SidOption(session_id=SESSION_ID)])),
        (LBTRU_SOURCE_PORT, LBTRU_RECEIVER_PORT, lbtru.LbtruSm(
            syn=1, sm_sqn=0, lead_sqn=0, trail_sqn=0,
            options=[lbtru.SidOption(session_id=SESSION_ID)])),
    ]
    for sport, dport, packet in ru_setup:
        rec.add(udp_frame(HOST, sport, HOST, dport, packet.build()))
    sri = LbmcMessage(type=MessageType.CONTROL, headers=[
        Sri(version=1, low_sqn=0, high_sqn=0, initial_sqn_known=1),
        UmeStoreGroup(grp_idx=0, grp_sz=1),
        UmeStore(store_tcp_port=STORE_PORT, store_ip_addr=HOST, src_reg_id=SOURCE_REGID),
    ])
    rec.add(_lbtru_data(0, LBTRU_RECEIVER_PORT, [sri]))

    # Receiver registration, naming the source's RegID.
    rcv = TcpConversation((HOST, 50002), (HOST, STORE_PORT), isn=(300, 700))
    rec.extend(rcv.handshake())
    rec.add(rcv.send(True, _control(
        UmePreg(s_flag=0, marker=1, reg_id=0, src_reg_id=SOURCE_REGID,
                transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                resp_port=RECEIVER_REQUEST_PORT, resp_ip=HOST, w_flag=w))))
    rec.add(rcv.send(False, _control(
        UmePregResp(reg_id=RECEIVER_REGID, s_flag=0, marker=1, transport_idx=TRANSPORT_IDX,
                    topic_idx=TOPIC_IDX, low_seqnum=0, high_seqnum=0, w_flag=w))))
    other = TcpConversation((HOST, 50003), (HOST, STORE_PORT), isn=(500, 1100))
    if rpp_mode:  # a second receiver, non-blocking: its mode travels as an option
        rec.extend(other.handshake())
        rec.add(other.send(True, _control(
            UmePreg(s_flag=0, marker=1, reg_id=0, src_reg_id=SOURCE_REGID,
                    transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                    resp_port=RECEIVER_REQUEST_PORT + 1, resp_ip=HOST, w_flag=1),
            *[o.header() for o in rpp.receiver_options(rpp.NON_BLOCKING)])))
        rec.add(other.send(False, _control(
            UmePregResp(reg_id=NON_BLOCKING_REGID, s_flag=0, marker=1,
                        transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX, low_seqnum=0,
                        high_seqnum=0, w_flag=1))))

    # Data to the receiver and to the store's own LBT-RU receiver; stability and consumption.
    for sqn in range(MESSAGES):
        data = LbmcMessage(type=MessageType.MESSAGE, tidx=TOPIC_IDX, sqn=sqn,
                           headers=[Topicname(topic=TOPIC)],
                           payload=f"message {sqn:04d}".encode())
        rec.add(_lbtru_data(sqn + 1, LBTRU_RECEIVER_PORT, [data]))
        rec.add(_lbtru_data(sqn + 1, LBTRU_STORE_PORT, [data]), gap=0.0001)
        rec.add(src.send(False, _control(UmeAck(
            type=AckType.STABLE, transport_idx=TRANSPORT_IDX, id_2=TOPIC_IDX,
            rcv_reg_id=0, seqnum=sqn))))
        if sqn != 3:  # the receiver misses message 3 and recovers it from the store below
            rec.add(rcv.send(True, _control(UmeAck(
                type=AckType.CDELV, transport_idx=TRANSPORT_IDX, id_2=RECEIVER_REGID,
                rcv_reg_id=RECEIVER_REGID, seqnum=sqn))))

    # Recovery: a retransmission request and the store's RETRANS answer on the same connection.
    rec.add(rcv.send(True, _control(UmeRxreq(
        request_idx=1, transport_idx=TRANSPORT_IDX, id_2=RECEIVER_REGID, seqnum=3,
        rx_port=RECEIVER_REQUEST_PORT, rx_ip=HOST))))
    retrans = LbmcMessage(type=MessageType.RETRANS, tidx=TOPIC_IDX, sqn=3,
                          headers=[Topicname(topic=TOPIC), Srcidx(srcidx=1)],
                          payload=b"message 0003")
    rec.add(rcv.send(False, retrans.build()))
    rec.add(rcv.send(True, _control(UmeAck(
        type=AckType.CDELV, transport_idx=TRANSPORT_IDX, id_2=RECEIVER_REGID,
        rcv_reg_id=RECEIVER_REGID, seqnum=3))))

    # Keepalives both ways, then orderly close.
    rec.add(src.send(True, _control(UmeKeepalive(
        type=KeepaliveType.SOURCE, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
        reg_id=SOURCE_REGID))), gap=1.0)
    rec.add(src.send(False, _control(UmeKeepalive(
        type=KeepaliveType.STORE, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
        reg_id=SOURCE_REGID))))
    rec.add(rcv.send(True, _control(UmeKeepalive(
        type=KeepaliveType.RECEIVER, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
        reg_id=RECEIVER_REGID))))
    if rpp_mode:  # "RPP Deregistration": the receivers, then the source
        for conn, reg_id, port in ((rcv, RECEIVER_REGID, RECEIVER_REQUEST_PORT),
                                   (other, NON_BLOCKING_REGID, RECEIVER_REQUEST_PORT + 1)):
            rec.add(conn.send(True, _control(
                UmePreg(s_flag=0, marker=1, reg_id=reg_id, src_reg_id=SOURCE_REGID,
                        transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX, resp_port=port,
                        resp_ip=HOST, w_flag=1, d_flag=1))))
            rec.add(conn.send(False, _control(
                UmePregResp(reg_id=reg_id, s_flag=0, marker=1, transport_idx=TRANSPORT_IDX,
                            topic_idx=TOPIC_IDX, d_flag=1, w_flag=1),
                UmeStoreid(store_id=1))))
        rec.add(src.send(True, _control(
            UmePreg(s_flag=1, marker=1, reg_id=SOURCE_REGID, transport_idx=TRANSPORT_IDX,
                    topic_idx=TOPIC_IDX, resp_port=SOURCE_REQUEST_PORT, resp_ip=HOST, w_flag=1,
                    d_flag=1), *overrides)))
        rec.add(src.send(False, _control(
            UmePregResp(reg_id=SOURCE_REGID, s_flag=1, marker=1, transport_idx=TRANSPORT_IDX,
                        topic_idx=TOPIC_IDX, d_flag=1, w_flag=1),
            UmeStoreid(store_id=1))))
        rec.extend(other.close())
    rec.extend(rcv.close())
    rec.extend(src.close())
    return rec.frames


REFERENCES = {"ume-basic.pcap": basic_exchange, "ume-rpp.pcap": rpp_exchange}
"""Reference captures by file name; each needs ``--store-port 14567`` (tshark has no default)."""


def write_all(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in REFERENCES.items():
        path = out_dir / name
        with PcapWriter(path) as writer:
            for ts, frame in build():
                writer.write(ts, frame)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0]) if args else Path(__file__).parent / "reference"
    for path in write_all(out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
