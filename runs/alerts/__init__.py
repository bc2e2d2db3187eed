"""Alerts: rules (`runs.alert_records`), the outbox written with the event (`outbox`),
the watchdog's scans for conditions that are not events (`scans`), the signed webhook
delivery with retries (`delivery`, `signing`) and the body (`body`). See docs/alerts.md."""
