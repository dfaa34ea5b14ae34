from django import template

from portal.notifications.live import unread_count

register = template.Library()


@register.simple_tag(takes_context=True)
def unread_notifications(context) -> int:
    """The signed-in person's unread count, for the bell."""
    request = context.get("request")
    user = getattr(request, "user", None) or context.get("user")
    return unread_count(user.pk) if user is not None and user.is_authenticated else 0
