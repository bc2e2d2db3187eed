from dashboard.views.actions import approve, budgets, bulk, cancel, retire, retry, send_input
from dashboard.views.pages import run_detail, run_list

__all__ = ["approve", "budgets", "bulk", "cancel", "retire", "retry", "run_detail", "run_list", "send_input"]
