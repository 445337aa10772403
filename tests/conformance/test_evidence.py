"""The timeline's one-line message summaries show what tshark shows."""

from __future__ import annotations

from conformance.evidence import summarize_message
from wire.lbmc import LbmcMessage, UmePregResp


def test_an_error_preg_resp_shows_its_error_code_not_flags_in_the_same_bits() -> None:
    """Code 13 sets the bits the N/W/D flags use when there is no error; tshark shows only
    the error code then, and so must the timeline."""
    text = summarize_message(LbmcMessage(headers=[
        UmePregResp(e_flag=1, error_code=13, reg_id=5)]).build())
    assert "error_code=13" in text and "e_flag=1" in text
    assert "d_flag" not in text and "w_flag" not in text and "code=" not in text.replace(
        "error_code=", "")


def test_a_granted_preg_resp_shows_its_flags_with_their_values() -> None:
    text = summarize_message(LbmcMessage(headers=[
        UmePregResp(o_flag=1, d_flag=1, reg_id=5, high_seqnum=9)]).build())
    assert "o_flag=1" in text and "d_flag=1" in text and "high_seqnum=9" in text
    assert "error_code" not in text
