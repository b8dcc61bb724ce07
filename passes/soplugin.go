package passes

import (
	"fmt"
	"plugin"
	"strings"
)

// LoadPlugin loads passes built with `go build -buildmode=plugin`: the
// plugin's init functions call Register. It needs the same Go version and
// the same versions of every shared package (Kiln included) as the kiln
// binary, Linux or macOS, and cgo; a mismatch is reported with its cause.
func LoadPlugin(path string) error {
	before := len(registry)
	if _, err := plugin.Open(path); err != nil {
		msg := err.Error()
		hint := ""
		switch {
		case strings.Contains(msg, "different version of package"):
			hint = " (the plugin and kiln were built from different versions of a shared package: rebuild both with the same Go version and module versions)"
		case strings.Contains(msg, "not implemented"):
			hint = " (shared-object plugins need Linux or macOS and a kiln built with cgo)"
		case strings.Contains(msg, "no such file"):
			hint = ""
		}
		return fmt.Errorf("cannot load pass plugin %s: %v%s", path, err, hint)
	}
	if len(registry) == before {
		return fmt.Errorf("pass plugin %s registered no pass (its init function should call passes.Register)", path)
	}
	return nil
}
