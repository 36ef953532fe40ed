"""Chat tabs: the controller of one chat, the tabs, the store, export, routing of replies."""
