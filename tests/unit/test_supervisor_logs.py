"""The log sink: numbered lines, bounded ring, paging, file rotation."""

from svc.supervisor.logsink import LogSink


def test_paging_by_offset_and_a_bounded_ring(tmp_path):
    sink = LogSink("M", str(tmp_path), max_bytes=1 << 20, backups=1, ring_lines=5)
    sink.feed("stdout", b"".join(b"line %d\n" % i for i in range(8)))
    page = sink.page(None, 3)
    assert [e["line"] for e in page["lines"]] == ["line 5", "line 6", "line 7"]
    assert (page["first_offset"], page["next_offset"], page["end_offset"]) == (3, 8, 8)
    old = sink.page(0, 10)
    assert [e["seq"] for e in old["lines"]] == [3, 4, 5, 6, 7]  # older lines left the ring
    assert sink.page(8, 10)["lines"] == [] and sink.page(8, 10)["next_offset"] == 8
    sink.feed("stderr", b"late\n")
    assert [e["line"] for e in sink.page(8, 10)["lines"]] == ["late"]


def test_file_rotation_by_size(tmp_path):
    sink = LogSink("M", str(tmp_path), max_bytes=2048, backups=2, ring_lines=10)
    for i in range(200):
        sink.feed("stdout", b"x" * 60 + b" %d\n" % i)
    sink.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "M.log" and "M.log.1" in names
    assert all(p.stat().st_size <= 2048 + 80 for p in tmp_path.iterdir())
    assert "199" in (tmp_path / "M.log").read_text()
