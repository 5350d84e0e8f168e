package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/standmeet/events/internal/testdb"
	"github.com/standmeet/events/webhook"
)

// Bytes from outside in the webhook tables: an endpoint's description, an
// operator's reason, a receiver's error and answer, with terminal escapes
// and multi-byte text long enough to be cut.
const (
	whDescription = "Orders \x1b]0;owned\a"
	whReason      = "moved \x1b[2J to a new host"
	whResponse    = "\u009b31m" + "ответ сервера, " + "очень длинный ответ сервера"
)

var whError = "status 500: \x1b[31m" + strings.Repeat("ошибка ", 12)

// webhookFixture makes two endpoints, one disabled, and the attempt log of
// the other: 3 of 4 requests succeeded in the last hour (10, 20, 30 and 40
// ms), one failed before; its breaker open. Nothing is delivered: the
// hosts are never contacted.
func webhookFixture(t *testing.T) (url string, orders, billing uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	url = testdb.URL(t)
	pool := testdb.Pool(t, url)
	wh, err := webhook.New(pool, &webhook.Config{Keys: []webhook.Key{{ID: "cli-key", Key: make([]byte, 32)}}})
	require.NoError(t, err)
	o, err := wh.Create(ctx, webhook.EndpointParams{URL: "https://hooks.example.com/orders/in?token=s3cret-token",
		Description: whDescription, Types: []string{"order.*"}, Scopes: []string{"tenant:42"},
		Headers: map[string]string{"X-Tenant": "tenant-header-value"}, SecretHeaders: map[string]string{"Authorization": "Bearer sealed-bearer"}})
	require.NoError(t, err)
	b, err := wh.Create(ctx, webhook.EndpointParams{URL: "https://billing.example.net:8443/in", Types: []string{"invoice.**"}})
	require.NoError(t, err)
	require.NoError(t, wh.Disable(ctx, b.ID, whReason))
	event := uuid.Must(uuid.NewV7())
	for _, a := range []struct {
		status      int
		class, err  string
		ms          int
		response    string
		ago         string
		attemptedIP string
	}{
		{0, "timeout", "context deadline exceeded", 40, "", "2 hours", ""},
		{200, "", "", 10, "ok", "40 minutes", "93.184.215.14"},
		{200, "", "", 20, "ok", "30 minutes", "93.184.215.14"},
		{200, "", "", 30, "", "20 minutes", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"},
		{500, "status", whError, 40, whResponse, "10 minutes", "93.184.215.14"},
	} {
		_, err = pool.Exec(ctx, `INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, status, error_class, error, duration_ms, dialed_ip, response, created_at)
			VALUES ($1, $2, 1, $3, $4, $5, $6, $7, $8, now() - $9::interval)`, o.ID, event, a.status, a.class, a.err, a.ms, a.attemptedIP, a.response, a.ago)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, `UPDATE webhook_endpoint_health SET failures = 7, open_until = now() + interval '1 hour' WHERE endpoint_id = $1`, o.ID)
	require.NoError(t, err)
	return url, o.ID, b.ID
}

// attemptRowRE matches a row of an attempts table.
var attemptRowRE = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT`)

// never are what no webhooks output may print.
var never = []string{"s3cret-token", "token=", "tenant-header-value", "sealed-bearer", "whsec_"}

func TestWebhooksTables(t *testing.T) {
	t.Parallel()
	url, orders, _ := webhookFixture(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"webhooks", []string{"webhooks"}},
		{"webhooks_inspect", []string{"webhooks", "inspect", orders.String()}},
	} {
		code, out, errOut := runCLI(t, url, "", tc.args...)
		require.Equal(t, exitOK, code, "%v: %s", tc.args, errOut)
		for _, b := range []string{"\x1b", "\a", "\u009b"} {
			require.NotContains(t, out, b, "%v: a control character reached the terminal", tc.args)
		}
		for _, s := range never {
			require.NotContains(t, out, s, tc.args)
		}
		require.True(t, utf8.ValidString(out), "%v: a rune was cut", tc.args)
		golden(t, tc.name, out)
	}

	// The list shows hosts only; inspect the path too.
	_, out, _ := runCLI(t, url, "", "webhooks")
	require.NotContains(t, out, "/orders/in")
	_, out, _ = runCLI(t, url, "", "webhooks", "inspect", orders.String())
	require.Contains(t, out, "path          /orders/in\n")

	// Failures only, and paging.
	_, out, _ = runCLI(t, url, "", "webhooks", "inspect", orders.String(), "--failures", "--limit", "1")
	require.Len(t, attemptRowRE.FindAllString(out, -1), 1, out)
	require.Contains(t, out, "older: --before 5\n")
	_, out, _ = runCLI(t, url, "", "webhooks", "inspect", orders.String(), "--failures", "--before", "5")
	require.Len(t, attemptRowRE.FindAllString(out, -1), 1, out)
	require.Contains(t, out, " timeout ")
	_, out, _ = runCLI(t, url, "", "webhooks", "--limit", "1")
	require.Contains(t, out, "next page: --after "+orders.String())

	// The breaker's state follows the host's threshold.
	_, out, _ = runCLI(t, url, "", "webhooks", "inspect", orders.String(), "--breaker-threshold", "10")
	require.Contains(t, out, "breaker       closed, 7 consecutive failures\n")
}

func TestWebhooksJSONIsExact(t *testing.T) {
	t.Parallel()
	url, orders, billing := webhookFixture(t)
	var list struct {
		Endpoints []map[string]any `json:"endpoints"`
		Next      *string          `json:"next"`
	}
	code, out, _ := runCLI(t, url, "", "--json", "webhooks")
	require.Equal(t, exitOK, code)
	for _, s := range never {
		require.NotContains(t, out, s)
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Nil(t, list.Next)
	require.Len(t, list.Endpoints, 2)
	o, b := list.Endpoints[0], list.Endpoints[1]
	require.Equal(t, orders.String(), o["id"])
	require.Equal(t, "hooks.example.com", o["host"])
	require.NotContains(t, o, "path", "the list shows hosts only")
	require.Equal(t, whDescription, o["description"], "exactly the recorded bytes")
	require.Equal(t, true, o["enabled"])
	require.Equal(t, map[string]any{"window_seconds": 3600.0, "attempts": 4.0, "successes": 3.0, "success_rate": 0.75,
		"latency_p50_ms": 25.0, "latency_p95_ms": 38.5, "latency_p99_ms": o["health"].(map[string]any)["latency_p99_ms"], "breaker": "open", "consecutive_failures": 7.0,
		"open_until": o["health"].(map[string]any)["open_until"]}, o["health"])
	require.NotNil(t, o["health"].(map[string]any)["open_until"])
	require.InDelta(t, 39.7, o["health"].(map[string]any)["latency_p99_ms"], 0.001)
	require.Equal(t, billing.String(), b["id"])
	require.Equal(t, "billing.example.net:8443", b["host"])
	require.Equal(t, false, b["enabled"])
	require.Equal(t, whReason, b["disabled_reason"])
	require.NotNil(t, b["disabled_at"])

	var one struct {
		Endpoint struct {
			Path          string   `json:"path"`
			Headers       []string `json:"headers"`
			SecretHeaders []string `json:"secret_headers"`
			Secrets       int      `json:"secrets"`
			TimeoutMS     int      `json:"timeout_ms"`
		} `json:"endpoint"`
		Attempts []struct {
			Status     int     `json:"status"`
			ErrorClass string  `json:"error_class"`
			Error      string  `json:"error"`
			DurationMS float64 `json:"duration_ms"`
			DialedIP   string  `json:"dialed_ip"`
			Response   string  `json:"response"`
		} `json:"attempts"`
	}
	code, out, _ = runCLI(t, url, "", "--json", "webhooks", "inspect", orders.String())
	require.Equal(t, exitOK, code)
	for _, s := range never {
		require.NotContains(t, out, s)
	}
	require.NoError(t, json.Unmarshal([]byte(out), &one))
	require.Equal(t, "/orders/in", one.Endpoint.Path)
	require.Equal(t, []string{"X-Tenant"}, one.Endpoint.Headers)
	require.Equal(t, []string{"Authorization"}, one.Endpoint.SecretHeaders)
	require.Equal(t, 1, one.Endpoint.Secrets)
	require.Equal(t, 15000, one.Endpoint.TimeoutMS)
	require.Len(t, one.Attempts, 5)
	a := one.Attempts[0] // newest first
	require.Equal(t, 500, a.Status)
	require.Equal(t, "status", a.ErrorClass)
	require.Equal(t, whError, a.Error)
	require.Equal(t, whResponse, a.Response)
	require.Equal(t, 40.0, a.DurationMS)
	require.Equal(t, "93.184.215.14", a.DialedIP)
}

func TestWebhooksErrors(t *testing.T) {
	t.Parallel()
	url, orders, _ := webhookFixture(t)
	for _, args := range [][]string{
		{"webhooks", "frobnicate"},
		{"webhooks", "--limit", "0"},
		{"webhooks", "--after", "nope"},
		{"webhooks", "--breaker-threshold", "0"},
		{"webhooks", "inspect"},
		{"webhooks", "inspect", "nope"},
		{"webhooks", "inspect", orders.String(), "--limit", "5000"},
	} {
		code, out, errOut := runCLI(t, url, "", args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
		require.Empty(t, out, "%v", args)
		require.Contains(t, errOut, "usage: events", "%v", args)
	}
	id := uuid.Must(uuid.NewV7())
	code, _, errOut := runCLI(t, url, "", "webhooks", "inspect", id.String())
	require.Equal(t, exitError, code)
	require.Equal(t, "events: webhook endpoint not found: "+id.String()+"\n", errOut)

	// No endpoints: an empty table, and an empty list in JSON.
	empty := testdb.URL(t)
	code, out, _ := runCLI(t, empty, "", "webhooks")
	require.Equal(t, exitOK, code)
	require.Equal(t, 1, strings.Count(out, "\n"), "the header only: %q", out)
	_, out, _ = runCLI(t, empty, "", "--json", "webhooks")
	require.JSONEq(t, `{"endpoints": []}`, out)
}
