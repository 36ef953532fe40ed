"""The one-click experiments behind the studio's Experiments menu."""
