package eventsui

import (
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/standmeet/events"
	"github.com/standmeet/events/webhook"
)

// The webhook endpoints pages, with Config.Webhooks: what an operator
// asks of an endpoint that stopped receiving (is it enabled, why not, is
// its breaker open, how often did it answer and how fast, what did it say)
// and the four remedies (enable, disable, replay one event, recover a time
// range of failures).
//
// An endpoint's URL is shown as its host (and, on its own page, its path),
// never its query, user info or fragment, where tokens live; header values
// and secrets are never shown, only header names and the number of secrets.
// The views below carry only what may be shown, so that no template can
// print more.

// actionText says what an action does, for the page that refuses it.
var actionText = map[Action]string{
	ActionRequeue:        "requeue events",
	ActionDiscard:        "discard events",
	ActionWebhookEnable:  "enable webhook endpoints",
	ActionWebhookDisable: "disable webhook endpoints",
	ActionWebhookReplay:  "replay webhook deliveries",
	ActionWebhookRecover: "recover webhook deliveries",
}

// webhookFuncs are the template functions of the endpoints pages.
var webhookFuncs = template.FuncMap{
	"ms":   formatMillis,
	"pct":  func(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + " %" },
	"join": strings.Join,
	"clip": clip,
	"long": func(s string) bool { return utf8.RuneCountInString(s) > responseClip || strings.Contains(s, "\n") },
}

// Page sizes of the endpoints list and of an endpoint's attempts.
const (
	endpointsPage = 50
	attemptsPage  = 50
	// responseClip is how much of a response body a row shows; the rest
	// opens below it.
	responseClip = 80
	// reasonMax bounds the reason an operator gives for a disable.
	reasonMax = 500
)

func (h *handler) webhookRoutes() {
	p := h.config.Prefix
	h.mux.HandleFunc("GET "+p+"/webhooks", h.webhooks)
	h.mux.HandleFunc("GET "+p+"/webhooks/{id}", h.endpoint)
	h.mux.HandleFunc("GET "+p+"/webhooks/{id}/disable", h.confirmDisable)
	h.mux.HandleFunc("POST "+p+"/webhooks/{id}/disable", h.endpointChange(ActionWebhookDisable, h.disableEndpoint))
	h.mux.HandleFunc("POST "+p+"/webhooks/{id}/enable", h.endpointChange(ActionWebhookEnable, h.enableEndpoint))
	h.mux.HandleFunc("POST "+p+"/webhooks/{id}/replay", h.endpointChange(ActionWebhookReplay, h.replay))
	h.mux.HandleFunc("POST "+p+"/webhooks/{id}/recover", h.endpointChange(ActionWebhookRecover, h.recover))
}

// endpointView is what the pages show of an endpoint: no URL, no header
// value, no secret.
type endpointView struct {
	ID                      uuid.UUID
	Host, Path, Description string
	Types, Scopes           []string
	// HeaderNames and SecretHeaderNames, sorted; values are never shown.
	HeaderNames, SecretHeaderNames []string
	// Secrets is how many signing secrets sign; KeyIDs the keys sealing them.
	Secrets                                                       int
	KeyIDs                                                        []string
	Timeout                                                       time.Duration
	MaxInFlight                                                   int
	RateLimit                                                     float64
	Enabled                                                       bool
	DisabledReason                                                string
	DisabledAt, EnabledAt, FailingSince, LastSuccessAt, CreatedAt time.Time
	Health                                                        webhook.EndpointHealth
	HasHealth                                                     bool
}

func viewEndpoint(e webhook.Endpoint) endpointView {
	v := endpointView{ID: e.ID, Description: e.Description, Types: e.Types, Scopes: e.Scopes,
		HeaderNames: slices.Sorted(maps.Keys(e.Headers)), SecretHeaderNames: slices.Sorted(maps.Keys(e.SecretHeaders)),
		Secrets: len(e.Secrets), Timeout: e.Timeout, MaxInFlight: e.MaxInFlight, RateLimit: e.RateLimit,
		Enabled: e.Enabled, DisabledReason: e.DisabledReason, DisabledAt: e.DisabledAt, EnabledAt: e.EnabledAt,
		FailingSince: e.FailingSince, LastSuccessAt: e.LastSuccessAt, CreatedAt: e.CreatedAt}
	v.Host, v.Path = hostPath(e.URL)
	for _, s := range e.Secrets {
		if s.KeyID != "" && !slices.Contains(v.KeyIDs, s.KeyID) {
			v.KeyIDs = append(v.KeyIDs, s.KeyID)
		}
	}
	return v
}

// hostPath returns the host (with its port) and the path of an endpoint's
// URL: never its user info, query or fragment.
func hostPath(raw string) (host, path string) {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unreadable URL)", ""
	}
	return u.Host, u.EscapedPath()
}

// health adds Health's figures to views, in one query.
func (h *handler) health(r *http.Request, views []endpointView) error {
	if len(views) == 0 {
		return nil // Health of no ID is the health of every endpoint
	}
	ids := make([]uuid.UUID, len(views))
	for i, v := range views {
		ids[i] = v.ID
	}
	list, err := h.config.Webhooks.Health(r.Context(), ids...)
	if err != nil {
		return err
	}
	byID := map[uuid.UUID]webhook.EndpointHealth{}
	for _, eh := range list {
		byID[eh.EndpointID] = eh
	}
	for i := range views {
		views[i].Health, views[i].HasHealth = byID[views[i].ID]
	}
	return nil
}

func (h *handler) webhooks(w http.ResponseWriter, r *http.Request) {
	var after uuid.UUID
	if s := r.URL.Query().Get("after"); s != "" {
		var err error
		if after, err = uuid.Parse(s); err != nil {
			h.fail(w, r, http.StatusBadRequest, "Bad request", "after is not an endpoint ID.")
			return
		}
	}
	res, err := h.config.Webhooks.List(r.Context(), after, endpointsPage)
	if err != nil {
		h.webhookError(w, r, err)
		return
	}
	views := make([]endpointView, len(res.Endpoints))
	for i, e := range res.Endpoints {
		views[i] = viewEndpoint(e)
	}
	if err := h.health(r, views); err != nil {
		h.webhookError(w, r, err)
		return
	}
	next := ""
	if res.Next != uuid.Nil {
		next = h.config.Prefix + "/webhooks?after=" + res.Next.String()
	}
	p := h.page("Webhook endpoints", "webhooks", r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "webhooks", struct {
		page
		Endpoints []endpointView
		NextURL   string
		Window    string
	}{p, views, next, formatWindow(webhook.HealthWindow)})
}

// endpointPage is the data of an endpoint's page.
type endpointPage struct {
	page
	Endpoint                                     endpointView
	Attempts                                     []webhook.Attempt
	FailuresOnly                                 bool
	NextURL, AllURL, FailuresURL                 string
	CanEnable, CanDisable, CanReplay, CanRecover bool
	RecoverFrom, RecoverTo, Window               string
}

// formLayout is how the recover form shows and reads times (an HTML
// datetime-local value, in UTC).
const formLayout = "2006-01-02T15:04"

func (h *handler) endpoint(w http.ResponseWriter, r *http.Request) {
	id, ok := h.endpointID(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	f := webhook.AttemptFilter{EndpointID: id, FailuresOnly: q.Get("failures") == "1", Limit: attemptsPage}
	if s := q.Get("before"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			h.fail(w, r, http.StatusBadRequest, "Bad request", "before is not an attempt ID.")
			return
		}
		f.Before = n
	}
	e, err := h.config.Webhooks.Get(r.Context(), id)
	if err != nil {
		h.webhookError(w, r, err)
		return
	}
	views := []endpointView{viewEndpoint(e)}
	if err := h.health(r, views); err != nil {
		h.webhookError(w, r, err)
		return
	}
	attempts, err := h.config.Webhooks.Attempts(r.Context(), f)
	if err != nil {
		h.webhookError(w, r, err)
		return
	}
	base := h.config.Prefix + "/webhooks/" + id.String()
	d := endpointPage{page: h.page(views[0].Host, "webhooks", r), Endpoint: views[0], Attempts: attempts,
		FailuresOnly: f.FailuresOnly, AllURL: base, FailuresURL: base + "?failures=1",
		CanEnable: !e.Enabled && h.may(r, ActionWebhookEnable), CanDisable: e.Enabled && h.may(r, ActionWebhookDisable),
		CanReplay:  e.Enabled && h.config.RiverClient != nil && h.may(r, ActionWebhookReplay),
		CanRecover: e.Enabled && h.config.RiverClient != nil && h.may(r, ActionWebhookRecover),
		Window:     formatWindow(webhook.HealthWindow)}
	if len(attempts) == attemptsPage {
		next := url.Values{"before": {strconv.FormatInt(attempts[len(attempts)-1].ID, 10)}}
		if f.FailuresOnly {
			next.Set("failures", "1")
		}
		d.NextURL = base + "?" + next.Encode()
	}
	now := time.Now().UTC()
	d.RecoverFrom = now.Add(-24 * time.Hour).Truncate(time.Minute).Format(formLayout)
	d.RecoverTo = now.Truncate(time.Minute).Add(time.Minute).Format(formLayout)
	h.render(w, http.StatusOK, "webhook", d)
}

func (h *handler) confirmDisable(w http.ResponseWriter, r *http.Request) {
	id, ok := h.endpointID(w, r)
	if !ok || !h.guard(w, r, ActionWebhookDisable) {
		return
	}
	e, err := h.config.Webhooks.Get(r.Context(), id)
	if err != nil {
		h.webhookError(w, r, err)
		return
	}
	v := viewEndpoint(e)
	h.render(w, http.StatusOK, "webhook-disable", struct {
		page
		Endpoint endpointView
		Action   string
		Cancel   string
		Max      int
	}{h.page("Disable endpoint?", "webhooks", r), v, h.config.Prefix + "/webhooks/" + id.String() + "/disable",
		h.config.Prefix + "/webhooks/" + id.String(), reasonMax})
}

// requestError is a change the request cannot make: its status and what
// the page says.
type requestError struct {
	status int
	title  string
	msg    string
}

func (e *requestError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &requestError{http.StatusBadRequest, "Bad request", fmt.Sprintf(format, args...)}
}

// errDisabled refuses a delivery to a disabled endpoint: its worker would
// cancel it.
var errDisabled = &requestError{http.StatusConflict, "Endpoint disabled",
	"Enable the endpoint first: deliveries to a disabled endpoint are cancelled, not sent."}

// endpointChange serves a POST that changes an endpoint: refused when
// cross-origin, read-only or not authorized before anything is read; f
// returns what the endpoint's page then says.
func (h *handler) endpointChange(action Action, f func(*http.Request, webhook.Endpoint) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.refuse(w, r, action) {
			return
		}
		id, ok := h.endpointID(w, r)
		if !ok {
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		if err := r.ParseForm(); err != nil {
			h.fail(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
			return
		}
		e, err := h.config.Webhooks.Get(r.Context(), id)
		if err != nil {
			h.webhookError(w, r, err)
			return
		}
		done, err := f(r, e)
		if err != nil {
			h.webhookError(w, r, err)
			return
		}
		target := h.config.Prefix + "/webhooks/" + id.String()
		http.Redirect(w, r, target+"?done="+url.QueryEscape(done), http.StatusSeeOther)
	}
}

func (h *handler) disableEndpoint(r *http.Request, e webhook.Endpoint) (string, error) {
	reason := strings.TrimSpace(strings.ReplaceAll(strings.ToValidUTF8(r.PostForm.Get("reason"), "\uFFFD"), "\x00", ""))
	if reason == "" {
		reason = "disabled by an operator"
	}
	if utf8.RuneCountInString(reason) > reasonMax {
		return "", badRequest("The reason is longer than %d characters.", reasonMax)
	}
	if err := h.config.Webhooks.Disable(r.Context(), e.ID, reason); err != nil {
		return "", err
	}
	return "Endpoint disabled; its pending deliveries are cancelled.", nil
}

func (h *handler) enableEndpoint(r *http.Request, e webhook.Endpoint) (string, error) {
	if err := h.config.Webhooks.Enable(r.Context(), e.ID); err != nil {
		return "", err
	}
	return "Endpoint enabled. Deliveries missed while it was disabled are not sent: recover them below.", nil
}

// errNoClient answers Replay and Recover without Config.RiverClient.
var errNoClient = &requestError{http.StatusNotFound, "Not found", "Replay and Recover need Config.RiverClient."}

func (h *handler) replay(r *http.Request, e webhook.Endpoint) (string, error) {
	if h.config.RiverClient == nil {
		return "", errNoClient
	}
	event, err := uuid.Parse(strings.TrimSpace(r.PostForm.Get("event")))
	if err != nil {
		return "", badRequest("That is not an event ID.")
	}
	if !e.Enabled {
		return "", errDisabled
	}
	if err := h.config.Webhooks.Replay(r.Context(), h.config.RiverClient, event, e.ID); err != nil {
		return "", err
	}
	return fmt.Sprintf("Event %s queued for delivery again.", event), nil
}

func (h *handler) recover(r *http.Request, e webhook.Endpoint) (string, error) {
	if h.config.RiverClient == nil {
		return "", errNoClient
	}
	from, err := parseFormTime(r.PostForm.Get("from"))
	if err != nil {
		return "", badRequest("From: %v", err)
	}
	to, err := parseFormTime(r.PostForm.Get("to"))
	if err != nil {
		return "", badRequest("To: %v", err)
	}
	if !from.Before(to) {
		return "", badRequest("From must be before To.")
	}
	if !e.Enabled {
		return "", errDisabled
	}
	n, err := h.config.Webhooks.Recover(r.Context(), h.config.RiverClient, e.ID, from, to)
	if err != nil {
		return "", fmt.Errorf("after %d deliveries: %w", n, err)
	}
	return fmt.Sprintf("%d deliveries queued: the events whose delivery failed from %s to %s (UTC) and never succeeded since.",
		n, from.Format("2006-01-02 15:04"), to.Format("2006-01-02 15:04")), nil
}

// parseFormTime reads a time of the recover form: an RFC 3339 time, or a
// date and time in UTC (what an HTML datetime-local input sends).
func parseFormTime(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{formLayout, formLayout + ":05", "2006-01-02 15:04", "2006-01-02 15:04:05"} {
		if t, err := time.ParseInLocation(layout, s, time.UTC); err == nil {
			return t, nil
		}
	}
	return time.Time{}, errors.New("give a time as 2006-01-02T15:04 (UTC) or in RFC 3339")
}

func (h *handler) endpointID(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	return h.pathID(w, r, "an endpoint")
}

// webhookError answers for an error of the endpoints pages: the request's
// own, 404, or 500 (logged).
func (h *handler) webhookError(w http.ResponseWriter, r *http.Request, err error) {
	var re *requestError
	switch {
	case errors.As(err, &re):
		h.fail(w, r, re.status, re.title, re.msg)
	case errors.Is(err, webhook.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "Not found", "No such webhook endpoint (it may have been deleted).")
	case errors.Is(err, events.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "Not found", "No such event in the outbox (retention may have deleted it).")
	default:
		h.config.Logger.ErrorContext(r.Context(), "eventsui: webhooks", slog.String("err", err.Error()))
		h.fail(w, r, http.StatusInternalServerError, "Error", "The database could not answer; see the server's log.")
	}
}

// formatMillis shows a latency: to the millisecond under 10 s. The attempt
// log keeps whole milliseconds, so 0 is under one.
func formatMillis(d time.Duration) string {
	if d < time.Millisecond {
		return "<1ms"
	}
	if d < 10*time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(100 * time.Millisecond).String()
}

// formatWindow shows the health window: "hour", or the duration.
func formatWindow(d time.Duration) string {
	if d == time.Hour {
		return "hour"
	}
	return d.String()
}

// clip cuts s to responseClip runes, on a rune, with "…".
func clip(s string) string {
	line, _, cut := strings.Cut(s, "\n")
	if utf8.RuneCountInString(line) > responseClip {
		runes := []rune(line)
		return string(runes[:responseClip-1]) + "…"
	}
	if cut {
		return line + " …"
	}
	return line
}
