"""Light and dark themes (Fusion palettes plus a small style sheet for the chat), following the system if asked."""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QApplication

LIGHT = {
    "window": "#f4f5f7",
    "base": "#ffffff",
    "alt": "#f0f1f4",
    "text": "#1f2328",
    "muted": "#667080",
    "button": "#f7f8fa",
    "highlight": "#2f6fde",
    "border": "#dde1e6",
    "indicator": "#8a93a0",
    "page": "#f4f5f7",
    "user_bg": "#e7effd",
    "user_border": "#c8d7f4",
    "assistant_bg": "#ffffff",
    "code_bg": "#f6f8fa",
    "code_border": "#d5dae0",
    "error_bg": "#fdecea",
    "error_fg": "#a3231b",
    "error_border": "#f3c1bd",
    "info_bg": "#eaf1fd",
    "info_border": "#c8d7f4",
}

DARK = {
    "window": "#1d1f23",
    "base": "#25272c",
    "alt": "#2b2e33",
    "text": "#e4e6ea",
    "muted": "#9aa1ab",
    "button": "#2d3036",
    "highlight": "#4f8cf0",
    "border": "#3a3e45",
    "indicator": "#7d8591",
    "page": "#1d1f23",
    "user_bg": "#26344b",
    "user_border": "#34476a",
    "assistant_bg": "#25272c",
    "code_bg": "#16181b",
    "code_border": "#3a3e45",
    "error_bg": "#3d2224",
    "error_fg": "#f4a19a",
    "error_border": "#6b3236",
    "info_bg": "#23304a",
    "info_border": "#34476a",
}

STYLE = """
#transcriptPage {{ background: {page}; }}
#transcript {{ background: {page}; }}
#userMessage {{ background: {user_bg}; border: 1px solid {user_border}; border-radius: 10px; }}
#assistantMessage {{ background: {assistant_bg}; border: 1px solid {border}; border-radius: 10px; }}
#role {{ font-weight: 600; }}
#messageStatus, #stats, #codeLanguage, #placeholder, #hint {{ color: {muted}; }}
#stats {{ font-size: {small}pt; }}
#inlineError {{ background: {error_bg}; color: {error_fg}; border: 1px solid {error_border};
               border-radius: 6px; padding: 6px; }}
#codeBlock {{ background: {code_bg}; border: 1px solid {code_border}; border-radius: 6px; }}
#codeText {{ background: {code_bg}; color: {text}; font-family: "{mono}"; font-size: {size}pt; }}
#noticeBar[level="error"] {{ background: {error_bg}; border-bottom: 1px solid {error_border}; }}
#noticeBar[level="error"] QLabel {{ color: {error_fg}; }}
#noticeBar[level="info"] {{ background: {info_bg}; border-bottom: 1px solid {info_border}; }}
#placeholder {{ font-size: {large}pt; padding: 40px; }}
#qt_toolbar_ext_button {{ background: {info_bg}; border: 1px solid {highlight}; border-radius: 4px; color: {text}; }}
#sectionTitle {{ font-weight: 600; color: {muted}; padding-top: 6px; }}
#samplingPanel {{ background: {window}; }}
#schemaEditor {{ font-family: "{mono}"; font-size: {small}pt; }}
#schemaError {{ color: {error_fg}; font-size: {small}pt; }}
#schemaOk {{ color: {muted}; font-size: {small}pt; }}
#estimateBox QLabel[role="value"] {{ font-weight: 600; }}
#fitsWarning {{ color: {error_fg}; }}
#fitsOk {{ color: {muted}; }}
#historyDialog QListWidget::item {{ padding: 6px 4px; }}
#droppedMarker {{ color: {muted}; font-style: italic; padding: 4px; border-top: 1px dashed {border}; }}
#prose {{ background: transparent; border: none; }}
#userMessage[dropped="true"] QLabel, #assistantMessage[dropped="true"] QLabel,
#userMessage[dropped="true"] #prose, #assistantMessage[dropped="true"] #prose {{ color: {muted}; }}
#contextText, #sidebarToggle {{ color: {muted}; font-size: {small}pt; }}
#contextBar {{ border: none; background: {border}; border-radius: 3px; }}
#contextBar::chunk {{ background: {highlight}; border-radius: 3px; }}
#contextBar[level="warn"]::chunk {{ background: {error_fg}; }}
#settingsPopup {{ background: {window}; border: 1px solid {border}; }}
QRadioButton::indicator, QCheckBox::indicator {{ width: 12px; height: 12px; border: 1px solid {indicator};
                                                background: {base}; }}
QRadioButton::indicator {{ border-radius: 7px; }}
QCheckBox::indicator {{ border-radius: 3px; }}
QRadioButton::indicator:checked {{ background: qradialgradient(cx: 0.5, cy: 0.5, radius: 0.5, fx: 0.5, fy: 0.5,
                                   stop: 0 {highlight}, stop: 0.5 {highlight}, stop: 0.6 {base}, stop: 1 {base}); }}
QCheckBox::indicator:checked {{ background: {highlight}; border-color: {highlight}; }}
QRadioButton::indicator:disabled, QCheckBox::indicator:disabled {{ border-color: {border}; background: {alt}; }}
"""


def _palette(colors: dict[str, str]) -> QPalette:
    palette = QPalette()
    roles = {
        QPalette.ColorRole.Window: "window",
        QPalette.ColorRole.WindowText: "text",
        QPalette.ColorRole.Base: "base",
        QPalette.ColorRole.AlternateBase: "alt",
        QPalette.ColorRole.Text: "text",
        QPalette.ColorRole.Button: "button",
        QPalette.ColorRole.ButtonText: "text",
        QPalette.ColorRole.ToolTipBase: "base",
        QPalette.ColorRole.ToolTipText: "text",
        QPalette.ColorRole.Highlight: "highlight",
        QPalette.ColorRole.PlaceholderText: "muted",
        QPalette.ColorRole.Mid: "border",
    }
    for role, key in roles.items():
        palette.setColor(role, QColor(colors[key]))
    palette.setColor(QPalette.ColorRole.HighlightedText, QColor("#ffffff"))
    palette.setColor(QPalette.ColorRole.Link, QColor(colors["highlight"]))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.WindowText, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(colors["muted"]))
    return palette


def system_is_dark(app: QApplication) -> bool:
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


class ThemeManager(QObject):
    """Applies the chosen theme and font size, and re-applies when the system scheme changes (mode 'system')."""

    def __init__(self, app: QApplication) -> None:
        super().__init__(app)
        self._app = app
        self.mode = "system"
        self.font_size = 10
        app.setStyle("Fusion")
        app.styleHints().colorSchemeChanged.connect(lambda _scheme: self.mode == "system" and self.apply())

    @property
    def dark(self) -> bool:
        return self.mode == "dark" or (self.mode == "system" and system_is_dark(self._app))

    def set(self, mode: str, font_size: int) -> None:
        self.mode = mode
        self.font_size = font_size
        self.apply()

    def apply(self) -> None:
        colors = DARK if self.dark else LIGHT
        font = QFont(self._app.font())
        font.setPointSize(self.font_size)
        self._app.setFont(font)
        self._app.setPalette(_palette(colors))
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
        sizes = {"size": self.font_size, "small": max(6, self.font_size - 1), "large": self.font_size + 2}
        self._app.setStyleSheet(STYLE.format(mono=mono, **sizes, **colors))
