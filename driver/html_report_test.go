package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHTMLReportInBrowser: kiln mem --html writes a self-contained page
// (nothing fetched from the network) that headless Chromium loads without
// console messages, and a screenshot of it is taken (kept in
// $KILN_ARTIFACTS when set, as CI's artefact).
func TestHTMLReportInBrowser(t *testing.T) {
	browser := findBrowser(t)
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	_, stderr, code := kiln(t, "mem", "../testdata/models/breadth/hf_decoder/model.onnx", "--passes", "autodiff,optimizer{kind=adam},fuse,reorder,assign", "--html", page)
	require.Equal(t, 0, code, stderr)
	raw, err := os.ReadFile(page)
	require.NoError(t, err)
	text := string(raw)
	for _, want := range []string{"<svg", "activations", "gradients", "optimizer state", "peak", "What each pass did", "<code>fuse</code>", "</html>"} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, strings.ReplaceAll(text, `xmlns="http://www.w3.org/2000/svg"`, ""), "http", "the page fetches nothing")
	loadInBrowser(t, browser, page, "memory-report.png")
}

// TestPlanHTMLInBrowser: kiln plan-check --html writes a self-contained
// page of a launch plan with swaps and offloaded gradients that headless
// Chromium loads without console messages.
func TestPlanHTMLInBrowser(t *testing.T) {
	browser := findBrowser(t)
	dir := t.TempDir()
	plan := filepath.Join(dir, "plan")
	_, stderr, code := kiln(t, "compile", "../testdata/models/small_cnn/model.onnx", "--target", "cuda", "--passes", "autodiff,fuse,reorder,swap{device-budget=0.9,params=false},assign", "-o", plan)
	require.Equal(t, 0, code, stderr)
	page := filepath.Join(dir, "plan.html")
	_, stderr, code = kiln(t, "plan-check", plan, "--html", page)
	require.Equal(t, 0, code, stderr)
	raw, err := os.ReadFile(page)
	require.NoError(t, err)
	text := string(raw)
	for _, want := range []string{"<svg", "stream 1 (copy)", "copy to host", "device bytes live", "host arena", "replayed", "</html>"} {
		require.Contains(t, text, want)
	}
	require.NotContains(t, strings.ReplaceAll(text, `xmlns="http://www.w3.org/2000/svg"`, ""), "http", "the page fetches nothing")
	loadInBrowser(t, browser, page, "plan-report.png")
}

// findBrowser is headless Chromium's path; CI must have it.
func findBrowser(t *testing.T) string {
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed (apt-get install -y chromium)")
		}
		t.Skip("chromium is not installed")
	}
	return browser
}

// loadInBrowser loads page in headless Chromium, fails on console
// messages and keeps a screenshot (in $KILN_ARTIFACTS as name when set).
func loadInBrowser(t *testing.T, browser, page, name string) {
	dir := t.TempDir()
	shot := filepath.Join(dir, "report.png")
	if a := os.Getenv("KILN_ARTIFACTS"); a != "" {
		require.NoError(t, os.MkdirAll(a, 0o755))
		shot = filepath.Join(a, name)
	}
	cmd := exec.Command(browser, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
		"--window-size=1100,900", "--screenshot="+shot, "file://"+page)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		require.NotContains(t, line, "CONSOLE", "the page logs to the console: %s", line)
		require.NotContains(t, line, "Uncaught")
	}
	st, err := os.Stat(shot)
	require.NoError(t, err)
	require.Greater(t, st.Size(), int64(20_000), "a screenshot of a drawn page, not a blank one")
}
