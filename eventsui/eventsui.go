// Package eventsui is a web view of the outbox of
// github.com/standmeet/events, to mount next to River UI: an overview (the
// stats, with the lag), lists of pending, retrying, poisoned and recent
// events with filters and keyset paging, each event's detail (fields, payload
// pretty-printed, attempts and last error, fanout with each subscriber's
// River job and River's state, attempts and last error of it, linked to
// River UI when its URL is configured), Requeue, and Discard behind a
// confirmation page; on the poisoned list, requeue or discard of every event
// matching the filter, after a confirmation page that says how many; and
// charts of the events fanned out per minute and their lag over the last
// hour or day, drawn on the server as inline SVG.
//
// Delivery state is per (event, subscriber): the poisoned list says for
// which subscribers each event is poisoned; an event's page shows each
// subscriber's delivery (delivered with its job, owed, or poisoned) with its
// error history, kept across requeues, and Requeue and Discard (behind a
// confirmation page) of one delivery. The relays page lists the relays of the
// last day (host, PID, version, subscribers, running, stopped or dead,
// listening or polling, failures, last round); the subscribers page each
// subscriber's state, owed and poisoned deliveries, oldest owed, when and by
// which relay it was last served, backfill, a warning naming the fix for an
// orphaned one (deploy it, or retire it), and Pause and Resume
// (ActionPause, ActionResume). The ordered subjects page (/chains) lists
// the subjects of ordered subscribers with jobs waiting — the head job and
// River's state of it, how many wait behind it — and marks the blocked
// ones (the head's job discarded, cancelled or deleted), with Resume and
// Skip behind a confirmation page (ActionChainResume, ActionChainSkip); the
// overview warns of blocked subjects. With Config.Webhooks,
// the webhook endpoints (package webhook): each one's state and why, its
// breaker, success rate and latency over the last hour, its recent
// attempts, and Enable, Disable behind a confirmation page, Replay and
// Recover. An endpoint's URL shows as its host and path, never its query;
// header values and secrets never.
//
// It is server-rendered HTML (html/template, which escapes everything: the
// payloads are user data) with embedded static assets: no build step, no CDN,
// no JavaScript (the Content-Security-Policy says script-src 'none'), works
// offline. State changes are POST only and refused when cross-origin
// (net/http's CrossOriginProtection). The host decides who may see and do
// what with Config.Authorize, which is required: the view never ships
// open; a button or link to an action shows only when Authorize allows that
// action for the request. Config.ReadOnly shows no buttons and refuses
// every change.
//
//	ui, err := eventsui.NewHandler(pool, &eventsui.Config{
//		Prefix:     "/outbox",
//		RiverUIURL: "/riverui",
//		Authorize:  func(r *http.Request, a eventsui.Action) bool { return isAdmin(r) },
//	})
//	mux.Handle("/outbox/", ui)
package eventsui

import (
	"bytes"
	"cmp"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/standmeet/events"
	"github.com/standmeet/events/internal/logging"
	"github.com/standmeet/events/webhook"
)

// Action is what a request wants to do, for Config.Authorize.
type Action string

// The actions.
const (
	ActionView    Action = "view"
	ActionRequeue Action = "requeue"
	ActionDiscard Action = "discard"

	// The webhook endpoints' actions (with Config.Webhooks).
	ActionWebhookEnable  Action = "webhook.enable"
	ActionWebhookDisable Action = "webhook.disable"
	ActionWebhookReplay  Action = "webhook.replay"
	ActionWebhookRecover Action = "webhook.recover"
)

// Config configures the handler.
type Config struct {
	// Prefix is the path the handler is mounted under, such as "/outbox";
	// empty for the root. The handler serves Prefix + "/", and every path
	// below it.
	Prefix string

	// Outbox is the schema of the library's tables, as every component is
	// built from it, and its OrphanAfter: how long a registered, active
	// subscriber may go unserved by every running relay before the
	// subscribers page warns of it as orphaned. The zero Outbox is the
	// search_path's.
	Outbox events.Outbox

	// RiverUIURL, when set, is where River UI is mounted (such as
	// "/riverui"): each subscriber's job links to its page there.
	RiverUIURL string

	// Authorize decides whether the request may do action. Required: the
	// view never ships open. A refused request gets 403. It is also asked,
	// while a page renders, whether the request may requeue or discard, to
	// show only the buttons that would work.
	Authorize func(r *http.Request, action Action) bool

	// ReadOnly shows no buttons and refuses every change with 403.
	ReadOnly bool

	// Refresh, when positive, reloads the overview and the lists every
	// Refresh (with <meta http-equiv="refresh">, no script), at least every
	// 5 s. A request's refresh parameter (seconds, 0 for off) overrides it.
	// Defaults to off.
	Refresh time.Duration

	// Webhooks, when set, adds the webhook endpoints pages (package
	// webhook): each endpoint's state, breaker, success rate and latency
	// over the last hour, its recent attempts, and Enable, Disable (behind a
	// confirmation page), Replay and Recover. Nil: no such pages, no link.
	Webhooks *webhook.Webhooks

	// RiverClient is the client that Replay and Recover insert deliveries
	// with (an insert-only client will do), of Outbox's schema. Without it,
	// the endpoints pages offer neither.
	RiverClient *river.Client[pgx.Tx]

	// Logger receives errors. Defaults to warnings and errors on standard
	// error, as every component of the library.
	Logger *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

var states = []events.EventState{events.EventPending, events.EventRetrying, events.EventPoisoned, events.EventRecent}

// invalidConfig is a refused Config field, as the root package reports one.
func invalidConfig(field, format string, args ...any) error {
	return &events.ValidationError{Kind: events.ErrInvalidConfig, Field: field, Reason: fmt.Sprintf(format, args...)}
}

// handler is the web view.
type handler struct {
	db     events.DB
	config Config
	pages  map[string]*template.Template
	mux    *http.ServeMux
	csrf   *http.CrossOriginProtection
}

// NewHandler returns the web view reading and changing the outbox through
// db (a *pgxpool.Pool). It fails without Config.Authorize.
func NewHandler(db events.DB, config *Config) (http.Handler, error) {
	if db == nil {
		return nil, invalidConfig("db", "is nil")
	}
	if config == nil || config.Authorize == nil {
		return nil, invalidConfig("Authorize", "is required: the host decides who may see and requeue events")
	}
	if err := config.Outbox.Validate(); err != nil {
		return nil, err
	}
	if c := config.RiverClient; c != nil && c.Schema() != config.Outbox.Schema {
		// Replay and Recover would insert deliveries where no worker of this
		// outbox looks (webhook refuses them at the press of a button).
		return nil, invalidConfig("RiverClient", "the River client's schema is %q, Outbox.Schema %q; name the same schema in both", c.Schema(), config.Outbox.Schema)
	}
	h := &handler{db: db, config: *config, pages: map[string]*template.Template{}, csrf: http.NewCrossOriginProtection()}
	h.config.Prefix = strings.TrimRight(h.config.Prefix, "/")
	if h.config.Prefix != "" && !strings.HasPrefix(h.config.Prefix, "/") {
		return nil, invalidConfig("Prefix", "%q: must start with /", config.Prefix)
	}
	h.config.Logger = cmp.Or(h.config.Logger, logging.Default())
	funcs := template.FuncMap{
		"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"lag":  formatLag,
		"sub":  func(a, b int) int { return a - b },
		"ago":  formatAgo,
	}
	maps.Copy(funcs, webhookFuncs)
	for _, page := range []string{"overview", "list", "event", "confirm", "error", "webhooks", "webhook", "webhook-disable", "relays", "subscribers", "chains"} {
		t, err := template.New(page).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("eventsui: %w", err)
		}
		h.pages[page] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("eventsui: %w", err)
	}
	p := h.config.Prefix
	h.mux = http.NewServeMux()
	h.mux.Handle("GET "+p+"/static/", http.StripPrefix(p+"/static/", http.FileServerFS(static)))
	h.mux.HandleFunc("GET "+p+"/{$}", h.overview)
	h.mux.HandleFunc("GET "+p+"/events", h.list)
	h.mux.HandleFunc("GET "+p+"/events/{id}", h.event)
	h.mux.HandleFunc("GET "+p+"/events/{id}/discard", h.confirmDiscard)
	h.mux.HandleFunc("POST "+p+"/events/{id}/requeue", h.change(ActionRequeue, "requeued", h.requeue))
	h.mux.HandleFunc("POST "+p+"/events/{id}/discard", h.change(ActionDiscard, "discarded", h.discard))
	h.mux.HandleFunc("GET "+p+"/bulk/{action}", h.confirmBulk)
	h.mux.HandleFunc("POST "+p+"/bulk/{action}", h.bulk)
	h.subscriberRoutes()
	h.chainRoutes()
	if h.config.Webhooks != nil {
		h.webhookRoutes()
	}
	return h, nil
}

func (h *handler) requeue(r *http.Request, id uuid.UUID) error {
	_, err := h.config.Outbox.Requeue(r.Context(), h.db, events.PoisonedFilter{EventIDs: []uuid.UUID{id}})
	return err
}

func (h *handler) discard(r *http.Request, id uuid.UUID) error {
	_, err := h.config.Outbox.Discard(r.Context(), h.db, events.PoisonedFilter{EventIDs: []uuid.UUID{id}})
	return err
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'none'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "same-origin")
	if !h.config.Authorize(r, ActionView) {
		h.fail(w, r, http.StatusForbidden, "Forbidden", "You may not view the outbox.")
		return
	}
	h.mux.ServeHTTP(w, r)
}

// page is what every template gets.
type page struct {
	Title, Nav, Prefix, RiverUIURL, Flash string
	States                                []events.EventState
	ReadOnly                              bool
	// Webhooks: whether the webhook endpoints pages exist.
	Webhooks bool
	// CanRequeue and CanDiscard: whether this request may (not read-only,
	// and Authorize allows it), so that only working buttons show.
	CanRequeue, CanDiscard bool
	// Refresh is the auto-refresh interval in seconds; 0 for none.
	Refresh int
}

func (h *handler) page(title, nav string, r *http.Request) page {
	return page{Title: title, Nav: nav, Prefix: h.config.Prefix, RiverUIURL: strings.TrimRight(h.config.RiverUIURL, "/"),
		Flash: r.URL.Query().Get("done"), States: states, ReadOnly: h.config.ReadOnly, Webhooks: h.config.Webhooks != nil,
		CanRequeue: h.may(r, ActionRequeue), CanDiscard: h.may(r, ActionDiscard)}
}

// may reports whether r may do a changing action.
func (h *handler) may(r *http.Request, action Action) bool {
	return !h.config.ReadOnly && h.config.Authorize(r, action)
}

// Bounds of the auto-refresh: often enough to follow, never a load.
const (
	minRefresh = 5 * time.Second
	maxRefresh = time.Hour
)

// refresh is the auto-refresh of a page, in seconds: the request's refresh
// parameter, or Config.Refresh; 0 for none.
func (h *handler) refresh(r *http.Request) int {
	d := h.config.Refresh
	if v := r.URL.Query().Get("refresh"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 {
		return 0
	}
	return int(min(max(d, minRefresh), maxRefresh) / time.Second)
}

func (h *handler) render(w http.ResponseWriter, status int, name string, data any) {
	var buf bytes.Buffer
	if err := h.pages[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.config.Logger.Error("eventsui: rendering", slog.String("page", name), slog.String("err", err.Error()))
		http.Error(w, "eventsui: rendering failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, status int, title, msg string) {
	h.render(w, status, "error", struct {
		page
		Message string
	}{h.page(title, "", r), msg})
}

func (h *handler) overview(w http.ResponseWriter, r *http.Request) {
	o := h.config.Outbox
	st, err := o.GetStats(r.Context(), h.db)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	span := time.Hour
	if r.URL.Query().Get("range") == "24h" {
		span = 24 * time.Hour
	}
	minutes, err := o.CountFanoutByMinute(r.Context(), h.db, time.Now().Add(-span))
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	p := h.page("Overview", "overview", r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "overview", struct {
		page
		Stats          events.Stats
		Range          string
		Fanned, Lag    chart
		RefreshChoices []int
		OrphanAfter    time.Duration
	}{p, st, map[bool]string{true: "24h", false: "1h"}[span > time.Hour], fannedChart(minutes), lagChart(minutes),
		[]int{0, 10, 30, 60}, cmp.Or(h.config.Outbox.OrphanAfter, events.OrphanAfterDefault)})
}

func (h *handler) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	params := events.ListEventsParams{State: events.EventState(cmp.Or(q.Get("state"), string(events.EventPending))),
		Type: q.Get("type"), Subject: q.Get("subject"), After: q.Get("after")}
	if !slices.Contains(states, params.State) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "Unknown state: use pending, retrying, poisoned or recent.")
		return
	}
	res, err := h.config.Outbox.ListEvents(r.Context(), h.db, params)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("%s %s", invalid.Field, invalid.Reason))
		return
	}
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	next := url.Values{"state": {string(params.State)}, "after": {res.Next}}
	if params.Type != "" {
		next.Set("type", params.Type)
	}
	if params.Subject != "" {
		next.Set("subject", params.Subject)
	}
	filter := url.Values{}
	if params.Type != "" {
		filter.Set("type", params.Type)
	}
	if params.Subject != "" {
		filter.Set("subject", params.Subject)
	}
	query := ""
	if len(filter) > 0 {
		query = "?" + filter.Encode()
	}
	var poisonedFor map[uuid.UUID][]string
	if params.State == events.EventPoisoned {
		poisonedFor = h.poisonedFor(r, res.Events)
	}
	p := h.page(string(params.State)+" events", string(params.State), r)
	p.Refresh = h.refresh(r)
	h.render(w, http.StatusOK, "list", struct {
		page
		State               events.EventState
		Type, Subject, Next string
		NextURL             string
		Filter              string // the filter as a query, "?type=…", for the bulk actions
		Events              []events.EventInfo
		// PoisonedFor names, on the poisoned list, the subscribers each
		// event is poisoned for (none: poisoned as a whole).
		PoisonedFor map[uuid.UUID][]string
	}{p, params.State, params.Type, params.Subject, res.Next,
		h.config.Prefix + "/events?" + next.Encode(), query, res.Events, poisonedFor})
}

// job is a fanout entry with River's state of its job and its River UI link.
type job struct {
	events.FanoutJob
	URL string
}

func (h *handler) event(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok {
		return
	}
	e, err := h.config.Outbox.GetEvent(r.Context(), h.db, id)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	// River's state of each job, in one query; without it (River's table
	// unreadable, say) the page still shows the job IDs.
	var jobs []job
	fanout, jobsErr := h.config.Outbox.ListFanoutJobs(r.Context(), h.db, id)
	if jobsErr != nil {
		h.config.Logger.WarnContext(r.Context(), "eventsui: reading the fanout's River jobs", slog.String("err", jobsErr.Error()))
		for name, jobID := range e.Fanout {
			fanout = append(fanout, events.FanoutJob{Subscriber: name, JobID: jobID})
		}
		slices.SortFunc(fanout, func(a, b events.FanoutJob) int { return strings.Compare(a.Subscriber, b.Subscriber) })
	}
	for _, fj := range fanout {
		j := job{FanoutJob: fj}
		if h.config.RiverUIURL != "" {
			j.URL = fmt.Sprintf("%s/jobs/%d", strings.TrimRight(h.config.RiverUIURL, "/"), fj.JobID)
		}
		jobs = append(jobs, j)
	}
	var pretty bytes.Buffer
	if json.Indent(&pretty, e.Payload, "", "  ") != nil {
		pretty.Reset()
		pretty.Write(e.Payload)
	}
	name, class := "pending", ""
	switch {
	case e.Poisoned():
		name, class = "poisoned", "poisoned"
	case !e.FannedOutAt.IsZero():
		name, class = "fanned out", "fanned"
	case e.Attempts > 0:
		name = "retrying"
	}
	h.render(w, http.StatusOK, "event", struct {
		page
		Event                 *events.EventInfo
		StateName, StateClass string
		Jobs                  []job
		JobsUnknown           bool
		Payload               string
		Deliveries            []delivery
	}{h.page(e.Type, "", r), &e, name, class, jobs, jobsErr != nil, pretty.String(), h.deliveries(&e, jobs)})
}

// confirm is a confirmation page: what is about to happen, and the form
// that does it (POST, so the same guards as any change apply).
type confirm struct {
	page
	Question, Detail string
	Action, Button   string
	Danger           bool
	IDs              []uuid.UUID       // the events the form acts on
	Fields           map[string]string // other hidden fields of the form
	Shown            []events.EventInfo
	More             bool // more events matched than one confirmation covers
	Cancel           string
}

// guard refuses a confirmation page to a request that could not post it.
func (h *handler) guard(w http.ResponseWriter, r *http.Request, action Action) bool {
	if h.config.ReadOnly {
		h.fail(w, r, http.StatusForbidden, "Forbidden", "This view is read-only.")
		return false
	}
	if !h.config.Authorize(r, action) {
		h.fail(w, r, http.StatusForbidden, "Forbidden", fmt.Sprintf("You may not %s.", actionText[action]))
		return false
	}
	return true
}

func (h *handler) confirmDiscard(w http.ResponseWriter, r *http.Request) {
	id, ok := h.id(w, r)
	if !ok || !h.guard(w, r, ActionDiscard) {
		return
	}
	e, err := h.config.Outbox.GetEvent(r.Context(), h.db, id)
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	if !e.Poisoned() {
		h.dbError(w, r, events.ErrNotPoisoned)
		return
	}
	detail := "It is deleted and never fanned out; this cannot be undone."
	if !e.FannedOutAt.IsZero() {
		var names []string
		for _, d := range e.Deliveries {
			if d.Poisoned() {
				names = append(names, d.Subscriber)
			}
		}
		detail = fmt.Sprintf("Its poisoned deliveries (for %s) are given up for good; the subscribers that got their jobs keep them, and the event stays until retention. This cannot be undone.",
			strings.Join(names, ", "))
	}
	h.render(w, http.StatusOK, "confirm", confirm{page: h.page("Discard event?", "", r),
		Question: "Discard this poisoned event for good?",
		Detail:   detail,
		Action:   h.config.Prefix + "/events/" + id.String() + "/discard", Button: "Discard", Danger: true,
		Shown: []events.EventInfo{e}, Cancel: h.config.Prefix + "/events/" + id.String()})
}

// bulkMax is the most events one bulk confirmation covers: its form carries
// their IDs, so that what is confirmed is what changes, not whatever
// matches the filter by the time the form is posted.
const bulkMax = 1000

// bulkActions are the bulk actions by path segment.
var bulkActions = map[string]Action{"requeue": ActionRequeue, "discard": ActionDiscard}

func (h *handler) confirmBulk(w http.ResponseWriter, r *http.Request) {
	action, ok := bulkActions[r.PathValue("action")]
	if !ok {
		h.fail(w, r, http.StatusNotFound, "Not found", "No such action.")
		return
	}
	if !h.guard(w, r, action) {
		return
	}
	q := r.URL.Query()
	params := events.ListEventsParams{State: events.EventPoisoned, Type: q.Get("type"), Subject: q.Get("subject"), Limit: bulkMax}
	res, err := h.config.Outbox.ListEvents(r.Context(), h.db, params)
	var invalid *events.ValidationError
	if errors.As(err, &invalid) {
		h.fail(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("%s %s", invalid.Field, invalid.Reason))
		return
	}
	if err != nil {
		h.dbError(w, r, err)
		return
	}
	c := confirm{page: h.page(fmt.Sprintf("%s %d events?", titleCase(string(action)), len(res.Events)), "poisoned", r),
		Action: h.config.Prefix + "/bulk/" + string(action), Button: fmt.Sprintf("%s %d events", titleCase(string(action)), len(res.Events)),
		Danger: action == ActionDiscard, More: res.Next != ""}
	for _, e := range res.Events {
		c.IDs = append(c.IDs, e.ID)
	}
	c.Shown = res.Events[:min(len(res.Events), 20)]
	filter := url.Values{"state": {string(events.EventPoisoned)}}
	var of string
	if params.Type != "" {
		filter.Set("type", params.Type)
		of += " of type " + params.Type
	}
	if params.Subject != "" {
		filter.Set("subject", params.Subject)
		of += " with subject " + params.Subject
	}
	c.Cancel = h.config.Prefix + "/events?" + filter.Encode()
	c.Question = fmt.Sprintf("%s %d poisoned events%s?", titleCase(string(action)), len(res.Events), of)
	switch action {
	case ActionRequeue:
		c.Detail = "They go back in the queue, each for every subscriber it is poisoned for, and are delivered as usual; attempts start again (each delivery's error history is kept)."
	case ActionDiscard:
		c.Detail = "Their poisoned deliveries are given up (events poisoned as a whole are deleted); this cannot be undone."
	}
	if len(res.Events) == 0 {
		c.Question, c.Detail = fmt.Sprintf("No poisoned events%s.", of), ""
	}
	h.render(w, http.StatusOK, "confirm", c)
}

// bulk serves a confirmed bulk action: the IDs the confirmation page
// listed, each changed as the single action would (one that is no longer
// poisoned is skipped).
func (h *handler) bulk(w http.ResponseWriter, r *http.Request) {
	action, ok := bulkActions[r.PathValue("action")]
	if !ok {
		h.fail(w, r, http.StatusNotFound, "Not found", "No such action.")
		return
	}
	if !h.refuse(w, r, action) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "The form could not be read.")
		return
	}
	raw := r.PostForm["id"]
	if len(raw) > bulkMax {
		h.fail(w, r, http.StatusBadRequest, "Bad request", fmt.Sprintf("At most %d events at once.", bulkMax))
		return
	}
	ids := make([]uuid.UUID, 0, len(raw))
	for _, s := range raw {
		id, err := uuid.Parse(s)
		if err != nil {
			h.fail(w, r, http.StatusBadRequest, "Bad request", "That is not an event ID.")
			return
		}
		ids = append(ids, id)
	}
	f := map[Action]func(*http.Request, uuid.UUID) error{ActionRequeue: h.requeue, ActionDiscard: h.discard}[action]
	var done, skipped int
	for _, id := range ids {
		err := f(r, id)
		switch {
		case err == nil:
			done++
		case errors.Is(err, events.ErrNotFound), errors.Is(err, events.ErrNotPoisoned):
			skipped++ // changed by someone else since the confirmation
		default:
			h.dbError(w, r, fmt.Errorf("after %d of %d: %w", done, len(ids), err))
			return
		}
	}
	msg := fmt.Sprintf("%d events %s.", done, map[Action]string{ActionRequeue: "requeued", ActionDiscard: "discarded"}[action])
	if skipped > 0 {
		msg += fmt.Sprintf(" %d skipped: no longer poisoned.", skipped)
	}
	http.Redirect(w, r, h.config.Prefix+"/events?state=poisoned&done="+url.QueryEscape(msg), http.StatusSeeOther)
}

func titleCase(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// change serves a state-changing POST: cross-origin requests, read-only
// mode and unauthorized requests are refused before anything changes.
func (h *handler) change(action Action, done string, f func(*http.Request, uuid.UUID) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.refuse(w, r, action) {
			return
		}
		id, ok := h.id(w, r)
		if !ok {
			return
		}
		if err := f(r, id); err != nil {
			h.dbError(w, r, err)
			return
		}
		target := h.config.Prefix + "/events/" + id.String()
		if action == ActionDiscard {
			target = h.config.Prefix + "/events?state=poisoned"
		}
		http.Redirect(w, r, target+sep(target)+"done="+url.QueryEscape(fmt.Sprintf("Event %s %s.", id, done)), http.StatusSeeOther)
	}
}

// refuse answers 403 to a changing request that is cross-origin, in
// read-only mode or not authorized, and reports whether it may go on.
func (h *handler) refuse(w http.ResponseWriter, r *http.Request, action Action) bool {
	if err := h.csrf.Check(r); err != nil {
		h.fail(w, r, http.StatusForbidden, "Forbidden", "Cross-origin request refused.")
		return false
	}
	return h.guard(w, r, action)
}

func (h *handler) id(w http.ResponseWriter, r *http.Request) (uuid.UUID, bool) {
	return h.pathID(w, r, "an event")
}

// pathID parses the request's {id}, answering 400 (naming what it should
// have been, such as "an event") when it is not a UUID.
func (h *handler) pathID(w http.ResponseWriter, r *http.Request, what string) (uuid.UUID, bool) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		h.fail(w, r, http.StatusBadRequest, "Bad request", "That is not "+what+" ID.")
		return uuid.Nil, false
	}
	return id, true
}

// dbError answers for an error of the library: 404, 409, or 500 (logged).
func (h *handler) dbError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, events.ErrNotFound):
		h.fail(w, r, http.StatusNotFound, "Not found", "No such event (it may have been deleted by retention).")
	case errors.Is(err, events.ErrNotPoisoned):
		h.fail(w, r, http.StatusConflict, "Not poisoned", "Only poisoned events can be requeued or discarded.")
	default:
		h.config.Logger.ErrorContext(r.Context(), "eventsui: database error", slog.String("err", err.Error()))
		h.fail(w, r, http.StatusInternalServerError, "Error", "The database could not answer; see the server's log.")
	}
}

func sep(u string) string {
	if strings.Contains(u, "?") {
		return "&"
	}
	return "?"
}
