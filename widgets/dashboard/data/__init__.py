"""The dashboard's Qt-free side: metric series, statistics, the redraw budget, export, colours."""
