//! The status page's minijinja templates: one environment, built once, every value written
//! into them HTML-escaped (text and quoted attributes alike).

use std::sync::LazyLock;

use minijinja::{AutoEscape, Environment};
use serde::Serialize;

/// Each template by name, its text in `templates/`.
const TEMPLATES: [(&str, &str); 10] = [
    ("page.html", include_str!("templates/page.html")),
    ("style.css", include_str!("templates/style.css")),
    ("refresh.js", include_str!("templates/refresh.js")),
    ("status.html", include_str!("templates/status.html")),
    ("aliases.html", include_str!("templates/aliases.html")),
    ("charts.html", include_str!("templates/charts.html")),
    ("slots.html", include_str!("templates/slots.html")),
    ("clients.html", include_str!("templates/clients.html")),
    ("batches.html", include_str!("templates/batches.html")),
    ("usage.html", include_str!("templates/usage.html")),
];

/// The page failed to render: a template that does not parse, or a value it cannot use.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RenderError {
    #[error("status page templates do not load: {0}")]
    Load(String),
    #[error("status page failed to render: {0}")]
    Render(#[from] minijinja::Error),
}

// The load error as its text: a static holds it, and every render that finds it copies it
// out, which `minijinja::Error` (not `Clone`) cannot be.
static ENV: LazyLock<Result<Environment<'static>, String>> = LazyLock::new(|| {
    let mut env = Environment::new();
    // Every template escapes for HTML, whatever its name: `style.css` and `refresh.js` write
    // no value, and the script's one argument goes through `tojson`.
    env.set_auto_escape_callback(|_| AutoEscape::Html);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    for (name, source) in TEMPLATES {
        env.add_template(name, source)
            .map_err(|e| format!("{name}: {e}"))?;
    }
    Ok(env)
});

/// Template `name` rendered with `ctx`.
pub(crate) fn render(name: &str, ctx: impl Serialize) -> Result<String, RenderError> {
    let env = ENV.as_ref().map_err(|e| RenderError::Load(e.clone()))?;
    Ok(env.get_template(name)?.render(ctx)?)
}

/// Template text `source`, which may import and include the page's, rendered with `ctx`.
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn render_str(source: &str, ctx: impl Serialize) -> String {
    ENV.as_ref().unwrap().render_str(source, ctx).unwrap()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_template_loads_and_escapes_for_html() {
        let env = ENV.as_ref().unwrap();
        for (name, _) in TEMPLATES {
            env.get_template(name).unwrap();
        }
        let out = env
            .render_str("{{ x }}", minijinja::context! { x => "<a href='/'>&\"" })
            .unwrap();
        // `render_str` names its template `<string>`: escaped all the same.
        assert_eq!(out, "&lt;a href=&#x27;&#x2f;&#x27;&gt;&amp;&quot;");
    }
}
