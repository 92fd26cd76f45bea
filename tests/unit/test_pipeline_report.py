"""report.html without Spark: the page embeds one decodable PNG per plot and says so when empty."""

from __future__ import annotations

import base64
import datetime as dt
import re

from txnguard.pipeline import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _data(**overrides):
    hour = dt.datetime(2026, 1, 1, 10)
    base = dict(
        title="t", totals={"decisions": 3},
        rejections_by_hour=[(hour, "late_write", 2), (hour, "not_in_transaction", 1)],
        latency_by_evidence=[("local", 10, 0.05, 0.1, 0.2, 0.3), ("coordinator", 2, 1.0, 2.0, 3.0, 4.0)],
        inventory=[{"client_family": "java", "client_software_name": "apache-kafka-java",
                    "client_software_version": "2.8.2", "pre_tv2": True, "connections": 1, "decisions": 3,
                    "rejections": 2, "unenforced_rejections": 0, "client_ids": ["p-1"], "first_seen": hour,
                    "last_seen": hour}],
        top_transactional_ids=[("txn-1", 3)],
        incidents=[("late_write", True, 2, "<script>alert(1)</script>")], quarantine=[("malformed_json", 1)])
    base.update(overrides)
    return report.ReportData(**base)


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([^"]+)"', page)]


def test_every_plot_is_an_embedded_png_and_written_beside_the_page(tmp_path):
    page = report.write(_data(), tmp_path).read_text()
    images = _images(page)
    assert len(images) == 4 and all(i.startswith(PNG_SIGNATURE) for i in images)
    assert sorted(p.name for p in (tmp_path / "report_images").iterdir()) == [
        "inventory_by_family.png", "latency_by_evidence.png", "rejections_over_time.png",
        "top_transactional_ids.png"]


def test_text_from_records_is_escaped():
    data = _data()
    report.render_plots(data)
    page = report.render_html(data)
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_an_empty_period_still_renders_every_plot(tmp_path):
    data = _data(rejections_by_hour=[], latency_by_evidence=[], inventory=[], top_transactional_ids=[],
                 incidents=[], quarantine=[])
    page = report.write(data, tmp_path).read_text()
    assert len(_images(page)) == 4
    assert "No line was quarantined." in page
