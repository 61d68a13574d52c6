"""The `replication` startup parameter, read as PostgreSQL reads it (protocol/replication.py)."""

from __future__ import annotations

import pytest

from pypool.protocol import replication as rep
from pypool.protocol.errors import PoolerError


@pytest.mark.parametrize("value", ["true", "on", "yes", "1", "TRUE", "t", "y", "ye", "On"])
def test_true_booleans_ask_for_physical_replication(value: str) -> None:
    assert rep.kind({"replication": value}) == rep.PHYSICAL


@pytest.mark.parametrize("value", ["false", "off", "no", "0", "f", "n", "of"])
def test_false_booleans_are_an_ordinary_login(value: str) -> None:
    assert rep.kind({"replication": value}) == rep.NONE


def test_database_asks_for_logical_replication() -> None:
    assert rep.kind({"replication": "database"}) == rep.LOGICAL
    assert rep.kind({"user": "u"}) == rep.NONE


@pytest.mark.parametrize("value", ["", "o", "maybe", "2", "databases", "Database", " on"])
def test_other_values_are_refused_with_postgresqls_words(value: str) -> None:
    with pytest.raises(PoolerError) as refused:
        rep.kind({"replication": value})
    assert refused.value.message == f'invalid value for parameter "replication": "{value}"'
    assert refused.value.sqlstate == "22023"
    assert rep.kind_or_none({"replication": value}) == rep.NONE


def test_options_are_tracked_only_for_ordinary_logins() -> None:
    params = {"user": "u", "options": "-c work_mem=1MB", "application_name": "a"}
    assert rep.tracked_part(params, rep.NONE) is params
    assert rep.tracked_part(params, rep.LOGICAL) == {"user": "u", "application_name": "a"}


def test_the_dedicated_servers_startup() -> None:
    startup = rep.server_startup(
        rep.PHYSICAL,
        {"user": "u", "replication": "on", "options": "-c wal_sender_timeout=0"},
        {"application_name": "standby", "DateStyle": "ISO"},
        {"application_name": "from-ini", "TimeZone": "UTC"},
    )
    assert startup == {"application_name": "standby", "TimeZone": "UTC", "DateStyle": "ISO",
                       "options": "-c wal_sender_timeout=0", "replication": "true"}
    logical = rep.server_startup(rep.LOGICAL, {"replication": "database"}, {}, {})
    assert logical == {"replication": "database"}


# --- TerminateWatch: the client's Terminate found in the bytes the pipe passes on -----------

STATUS_UPDATE = b"d" + (38).to_bytes(4, "big") + b"r" + bytes(33)  # a standby status update
TERMINATE = b"X\x00\x00\x00\x04"


@pytest.mark.timeout(10)
def test_terminate_found_after_whole_messages() -> None:
    data = STATUS_UPDATE + b"c\x00\x00\x00\x04" + TERMINATE
    assert rep.TerminateWatch().end_of_terminate(data) == len(data)


@pytest.mark.timeout(10)
def test_terminate_found_one_byte_at_a_time() -> None:
    data = STATUS_UPDATE + TERMINATE
    watch = rep.TerminateWatch()
    found = [at for at in range(len(data)) if watch.end_of_terminate(data[at:at + 1]) >= 0]
    assert found == [len(data) - 1]  # the Terminate's last byte, and nothing before


@pytest.mark.timeout(10)
def test_an_x_inside_a_body_is_not_a_terminate() -> None:
    body = b"X\x00\x00\x00\x04" * 6 + b"r" + bytes(3)
    data = b"d" + (4 + len(body)).to_bytes(4, "big") + body
    watch = rep.TerminateWatch()
    assert watch.end_of_terminate(data[:7]) == -1
    assert watch.end_of_terminate(data[7:]) == -1
    assert watch.end_of_terminate(TERMINATE) == len(TERMINATE)


@pytest.mark.timeout(10)
def test_a_bad_length_stops_the_watch() -> None:
    watch = rep.TerminateWatch()
    assert watch.end_of_terminate(b"d\x00\x00\x00\x02") == -1
    assert watch.end_of_terminate(TERMINATE) == -1  # the framing is lost: bytes pass on


@pytest.mark.timeout(10)
def test_the_offset_is_the_terminates_end_not_the_chunks() -> None:
    copy_done = b"c\x00\x00\x00\x04"
    data = copy_done + TERMINATE + b"Q\x00\x00\x00\x09junk"
    assert rep.TerminateWatch().end_of_terminate(data) == len(copy_done) + len(TERMINATE)


@pytest.mark.timeout(10)
def test_a_terminate_header_split_across_chunks() -> None:
    watch = rep.TerminateWatch()
    assert watch.end_of_terminate(STATUS_UPDATE + TERMINATE[:3]) == -1
    assert watch.end_of_terminate(TERMINATE[3:] + b"after") == 2


@pytest.mark.timeout(10)
def test_an_x_of_another_length_is_not_a_terminate() -> None:
    watch = rep.TerminateWatch()
    assert watch.end_of_terminate(b"X\x00\x00\x00\x06ab") == -1  # PostgreSQL's to refuse
    assert watch.end_of_terminate(TERMINATE) == len(TERMINATE)
