; Inno Setup 6 script: the Windows installer of the PyInstaller bundle in dist\inference-studio.
; Built by CI (.github/workflows/installers.yml) after `python packaging/build.py --bundle-only`:
;   iscc /DAppVersion=0.1.0 packaging\windows\inference-studio.iss
; The version is passed in from app/version.py (the single source); the default below is only a fallback.
#ifndef AppVersion
  #define AppVersion "0.0.0"
#endif
#define AppName "Inference Studio"
#define Bundle "..\..\dist\inference-studio"

[Setup]
AppId={{6D1F3C0B-6C43-4F8B-9B4E-2E7C2D6A5F11}
AppName={#AppName}
AppVersion={#AppVersion}
AppVerName={#AppName} {#AppVersion}
AppPublisher=Inference Studio developers
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; per-user installs need no administrator (the dialog offers both)
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
MinVersion=10.0
OutputDir=..\..\dist
OutputBaseFilename=inference-studio-{#AppVersion}-windows-x64-setup
SetupIconFile=..\..\build\icons\inference-studio.ico
UninstallDisplayIcon={app}\Inference Studio.exe
UninstallDisplayName={#AppName} {#AppVersion}
Compression=lzma2/max
SolidCompression=yes
LZMANumBlockThreads=4
WizardStyle=modern

[Languages]
Name: "english"; MessagesFile: "compiler:Default.isl"

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
; the whole one-folder bundle: two executables (windowed for the Start menu, console for the command line)
Source: "{#Bundle}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\Inference Studio.exe"
Name: "{group}\{cm:UninstallProgram,{#AppName}}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\Inference Studio.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\Inference Studio.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[UninstallDelete]
; Python may write bytecode caches next to the bundled sources; chats and converted models live in the user's
; profile (%LOCALAPPDATA%\inference-studio) and are kept
Type: filesandordirs; Name: "{app}\_internal\__pycache__"
