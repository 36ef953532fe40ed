"""The studio's Qt-free domain: chats, their settings and replies' statistics, the user's model choice; shared by
app/, widgets/ and the CLI, built on engine types only."""
